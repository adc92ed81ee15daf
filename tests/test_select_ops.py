"""Selection custom ops: opcheck, fake impls and input validation (world=1 gloo group)."""
from __future__ import annotations

import pytest
import torch

from tpflare.testing import run_ranks

pytestmark = pytest.mark.multiproc


def _opcheck_and_bad_inputs(rank, world):
    import tpflare  # noqa: F401
    from tpflare.distributed import group_name_of

    g = group_name_of(None)
    ops = torch.ops.tpflare
    torch.manual_seed(0)
    s = torch.randn(3, 5)
    s[0, 1] = float("-inf")  # no NaN here: opcheck compares outputs with assert_close,
    s[1, 2] = -0.0            # which calls NaN != NaN (NaN bits: test_select_ranks.py)
    i = torch.randperm(15, dtype=torch.int32).view(3, 5)
    i[2, :2] = -1
    checked = []
    for with_scores in (False, True):
        for k in (1, 5):
            torch.library.opcheck(ops.select_replicated, (s, i, k, g, with_scores))
            torch.library.opcheck(ops.select, (s, i, k, g, with_scores))
            for plan in ("allgather", "bf16"):
                torch.library.opcheck(ops.select_owner, (s, i, k, g, with_scores, plan))
            checked.append((with_scores, k))
    for table in (([1], "replicated"), ([1, 4], "owner/bf16,owner/allgather")):
        torch.library.opcheck(ops.select_by_rows, (s, i, 2, g, True, *table))
    for plan in ("allgather", "bf16"):
        local = torch.tensor([[0, -1, 2 ** 31 - 1, -(2 ** 31)], [7, 8, 9, 10]], dtype=torch.int32)
        torch.library.opcheck(ops.replicate_ids, (local, 2, g, plan))
        assert torch.equal(ops.replicate_ids(local, 2, g, plan), local)

    good = dict(scores=s, ids=i, k=2, group_name=g)
    bad = {
        "fp64 scores": (dict(scores=s.double()), "scores must be float32"),
        "int64 ids": (dict(ids=i.long()), "ids must be int32"),
        "1-D scores": (dict(scores=s[0], ids=i[0]), "scores must be 2-D"),
        "shape mismatch": (dict(ids=i[:, :4]), "ids shape"),
        "k=0": (dict(k=0), r"k=0 must be in \[1, 5\]"),
        "k > W*C": (dict(k=6), r"k=6 must be in \[1, 5\]"),
        "unknown group": (dict(group_name="no-such-group"), "group_name='no-such-group'"),
    }
    errors = {}
    for what, (change, match) in bad.items():
        a = dict(good, **change)
        for op_name, call in (
            ("select", lambda a: ops.select(a["scores"], a["ids"], a["k"], a["group_name"], False)),
            ("select_replicated", lambda a: ops.select_replicated(
                a["scores"], a["ids"], a["k"], a["group_name"], True)),
            ("select_owner", lambda a: ops.select_owner(
                a["scores"], a["ids"], a["k"], a["group_name"], False, "bf16")),
            ("select_by_rows", lambda a: ops.select_by_rows(
                a["scores"], a["ids"], a["k"], a["group_name"], True, [2, 8], "owner/bf16,replicated")),
        ):
            try:
                call(a)
                errors[(what, op_name)] = (None, match)
            except Exception as e:
                errors[(what, op_name)] = (f"{type(e).__name__}: {e}", match)
    extra = {}
    for what, call in {
        "bad plan": lambda: ops.select_owner(s, i, 2, g, False, "fp8"),
        "replicate rows": lambda: ops.replicate_ids(i[:2], 3, g, "allgather"),
        "replicate dtype": lambda: ops.replicate_ids(s, 3, g, "bf16"),
        "replicate plan": lambda: ops.replicate_ids(i, 3, g, "int8"),
        "table unsorted": lambda: ops.select_by_rows(s, i, 2, g, False, [8, 2], "replicated,replicated"),
        "table lengths": lambda: ops.select_by_rows(s, i, 2, g, False, [2, 8], "replicated"),
        "table name": lambda: ops.select_by_rows(s, i, 2, g, False, [2], "owner/fp8"),
        "table kernel": lambda: ops.select_by_rows(s, i, 2, g, False, [2], "replicated", "fast"),
    }.items():
        try:
            call()
            extra[what] = None
        except Exception as e:
            extra[what] = f"{type(e).__name__}: {e}"
    return dict(checked=checked, errors=errors, extra=extra)


def test_opcheck_and_validation():
    import re

    (res,) = run_ranks(_opcheck_and_bad_inputs, 1, timeout=180)
    assert len(res["checked"]) == 4
    for (what, op_name), (msg, match) in res["errors"].items():
        assert msg is not None and msg.startswith("ValueError"), (what, op_name, msg)
        assert re.search(match, msg), (what, op_name, msg)
        assert f"tpflare.{op_name}" in msg, (what, op_name, msg)
    extra = res["extra"]
    assert extra["bad plan"].startswith("ValueError") and "id_replication='fp8'" in extra["bad plan"]
    assert "local has 2 rows, expected ceil(q/W) = 3" in extra["replicate rows"]
    assert "local must be a 2-D int32" in extra["replicate dtype"]
    assert "plan='int8'" in extra["replicate plan"]
    assert "rows must be ascending distinct positive ints, got [8, 2]" in extra["table unsorted"]
    assert "must be non-empty and of one length, got 2 and 1" in extra["table lengths"]
    assert "compositions ['owner/fp8']" in extra["table name"]
    assert "kernel='fast'" in extra["table kernel"]


def test_fake_impls_without_a_group():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tpflare  # noqa: F401

    ops = torch.ops.tpflare
    with FakeTensorMode():
        s, i = torch.empty(7, 16), torch.empty(7, 16, dtype=torch.int32)
        ids, sc = ops.select(s, i, 40, "fake", True)
        assert ids.shape == (7, 40) and ids.dtype == torch.int32 and sc.shape == (7, 40)
        ids, sc = ops.select_owner(s, i, 40, "fake", False, "bf16")
        assert ids.shape == (7, 40) and sc.shape == (7, 0) and sc.dtype == torch.float32
        ids, sc = ops.select_replicated(s, i, 3, "fake", True)
        assert ids.shape == (7, 3) and sc.dtype == torch.float32
        ids, sc = ops.select_by_rows(s, i, 5, "fake", False, [1, 8], "replicated,owner/bf16")
        assert ids.shape == (7, 5) and sc.shape == (7, 0)
        r = ops.replicate_ids(torch.empty(2, 9, dtype=torch.int32), 7, "fake", "bf16")
        assert r.shape == (7, 9) and r.dtype == torch.int32
        with pytest.raises(ValueError, match="scores must be float32"):
            ops.select(s.half(), i, 4, "fake", False)


def test_owner_blocks_are_balanced_and_contiguous():
    from tpflare.ops.select import _from_owner_blocks, _to_owner_blocks, owner_rows, rows_per_owner

    for q in range(1, 12):
        for world in (1, 2, 3, 4, 8):
            blocks = [owner_rows(q, world, r) for r in range(world)]
            assert sum(n for _, n in blocks) == q
            assert max(n for _, n in blocks) - min(n for _, n in blocks) <= 1
            assert [st for st, _ in blocks] == [sum(n for _, n in blocks[:r]) for r in range(world)]
            assert max(n for _, n in blocks) == rows_per_owner(q, world)
            x = torch.arange(q * 3).view(q, 3)
            b = _to_owner_blocks(x, world, fill=-1)
            assert b.shape == (world, rows_per_owner(q, world), 3)
            for r, (st, n) in enumerate(blocks):
                assert torch.equal(b[r, :n], x[st:st + n]) and (b[r, n:] == -1).all()
            assert torch.equal(_from_owner_blocks(b, q), x)
