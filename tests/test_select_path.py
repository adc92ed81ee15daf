"""Which selection kernel a call gets (CPU: the policy needs neither Triton nor a GPU)."""
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


def test_module_imports_without_triton_kernels():
    # the staged module must import on a machine without Triton (CI): its kernels are optional
    from tpflare.ops import select_staged

    assert select_staged.HIST_BITS == 12
    assert callable(select_staged.staged_select)
