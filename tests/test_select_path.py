"""Which selection kernel a call gets (CPU: the policy needs neither Triton nor a GPU; the
import itself checks that ``select_kernel`` and ``select_staged`` load without Triton in CI)."""
from tpflare.ops import select_kernel as sk


def test_path_policy():
    """The staged path for few rows, and for up to 64 rows of more candidates than the row
    kernel holds in registers; the row kernel beyond."""
    assert sk.choose_path(1, 16384, 2048, 132) == "staged"
    assert sk.choose_path(8, 16384, 2048, 132) == "staged"
    assert sk.choose_path(9, 16384, 2048, 132) == "row"
    assert sk.choose_path(64, 16384, 2048, 132) == "row"
    assert sk.choose_path(64, 32768, 2048, 132) == "staged"
    assert sk.choose_path(256, 32768, 2048, 132) == "row"
