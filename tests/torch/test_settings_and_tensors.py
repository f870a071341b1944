"""What the "cco" backend decides before any collective: where its settings come from,
which node id and certificate a rank uses, and how a tensor becomes the array CCO reads
(no process group is made here)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'cco[torch]')")

from cco.torch import tensors  # noqa: E402
from cco.torch.options import Options, settings  # noqa: E402
from cco.transport import create_dev_pki  # noqa: E402
from cco.wire.errors import CcoError  # noqa: E402
from cco.wire.registries import DType, ReduceOp, Role  # noqa: E402


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    create_dev_pki(tmp_path / "pki", [("ep-0", Role.ENDPOINT), ("ep-1", Role.ENDPOINT)])
    return tmp_path / "pki"


def test_the_config_file_then_variables_then_pg_options(pki: Path, tmp_path: Path) -> None:
    config = tmp_path / "cco.toml"
    config.write_text(f'rendezvous = "127.0.0.1:5000"\npki_dir = "{pki}"\nwidth = 16\n')
    environ = {"CCO_CONFIG": str(config)}
    resolved = settings(None, global_rank=1, group_name="0", default_group=True, environ=environ)
    assert (resolved.rendezvous, resolved.width, resolved.node_id) == ("127.0.0.1:5000", 16, "ep-1")
    assert resolved.nonfinite == "propagate" and resolved.group_id is None
    environ |= {"CCO_RENDEZVOUS": "127.0.0.1:6000", "CCO_WIDTH": "8"}
    resolved = settings(None, global_rank=1, group_name="0", default_group=True, environ=environ)
    assert (resolved.rendezvous, resolved.width) == ("127.0.0.1:6000", 8)
    options = Options(rendezvous="127.0.0.1:7000", width=32, nonfinite="raise")
    resolved = settings(options, global_rank=1, group_name="0", default_group=True, environ=environ)
    assert (resolved.rendezvous, resolved.width, resolved.nonfinite) == ("127.0.0.1:7000", 32, None)


def test_node_ids_follow_the_rank_and_groups_issue_their_own_certificates(pki: Path) -> None:
    environ = {"CCO_PKI_DIR": str(pki), "LOCAL_RANK": "1"}
    template = Options(node_id="host-a-{local_rank}")
    assert (
        settings(template, global_rank=5, group_name="0", default_group=True, environ=environ).node_id
        == "host-a-1"
    )
    assert not (pki / "ep-0.g3.pem").exists()
    resolved = settings(None, global_rank=0, group_name="3", default_group=False, environ=environ)
    assert resolved.node_id == "ep-0.g3"
    assert (pki / "ep-0.g3.pem").exists()  # issued from the CA key in the directory
    assert resolved.transport.cert_file == pki / "ep-0.g3.pem"


def test_a_missing_certificate_or_directory_is_named_with_its_remedy(pki: Path) -> None:
    (pki / "ca.key").unlink()  # a worker machine: no CA key
    with pytest.raises(
        CcoError, match=r"no certificate for node id ep-7 .*cco-node certs --dir DIR ep-7:endpoint"
    ):
        settings(None, global_rank=7, group_name="0", default_group=True, environ={"CCO_PKI_DIR": str(pki)})
    with pytest.raises(CcoError, match="CCO_PKI_DIR"):
        settings(None, global_rank=0, group_name="0", default_group=True, environ={})
    with pytest.raises(CcoError, match="CCO_WITDH is not a CCO setting"):  # a misspelled variable is named
        settings(None, global_rank=0, group_name="0", default_group=True, environ={"CCO_WITDH": "8"})
    with pytest.raises(ValueError, match="nonfinite"):
        Options(nonfinite="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="width"):
        Options(width=12)


def test_stripes_come_from_options_or_cco_stripes_each_with_its_own_certificate(pki: Path) -> None:
    environ = {"CCO_PKI_DIR": str(pki)}
    one = settings(None, global_rank=0, group_name="0", default_group=True, environ=environ)
    assert one.stripes == ()
    three = settings(
        None, global_rank=1, group_name="0", default_group=True, environ=environ | {"CCO_STRIPES": "3"}
    )
    assert [t.cert_file for t in three.stripes] == [pki / "ep-1.s1.pem", pki / "ep-1.s2.pem"]
    assert three.transport.cert_file == pki / "ep-1.pem"
    sub = settings(
        Options(stripes=2),
        global_rank=0,
        group_name="4",
        default_group=False,
        environ=environ | {"CCO_STRIPES": "3"},
    )
    assert [t.cert_file for t in sub.stripes] == [pki / "ep-0.g4.s1.pem"]  # Options first
    with pytest.raises(ValueError, match="stripes"):
        Options(stripes=0)
    with pytest.raises(CcoError, match="CCO_STRIPES 'two'"):
        settings(
            None, global_rank=0, group_name="0", default_group=True, environ=environ | {"CCO_STRIPES": "two"}
        )
    (pki / "ca.key").unlink()
    named = r"no certificate for node id ep-0.s1 .*cco-node certs --dir DIR ep-0.s1:endpoint"
    with pytest.raises(CcoError, match=named):
        settings(Options(stripes=3), global_rank=0, group_name="0", default_group=True, environ=environ)


def test_torch_ops_map_to_ccos_and_the_others_are_refused() -> None:
    import torch.distributed as dist

    assert tensors.reduce_op(dist.ReduceOp.AVG) is ReduceOp.AVG
    assert tensors.reduce_op(dist.ReduceOp(dist.ReduceOp.BXOR)) is ReduceOp.BXOR
    for refused in (dist.ReduceOp.PRODUCT, dist._make_nccl_premul_sum(2.0)):
        with pytest.raises(CcoError, match=r"PRODUCT|PREMUL_SUM"):
            tensors.reduce_op(refused)


def test_tensors_are_shared_not_copied_except_where_said() -> None:
    t = torch.arange(6, dtype=torch.float32)
    shared = tensors.moved(t)
    shared[0] = 42.0
    assert t[0] == 42.0  # the same memory
    source, dtype = tensors.reduction_input(t, ReduceOp.SUM, "allreduce", copy=False)
    assert dtype is None and source.base is not None and source.ctypes.data == t.data_ptr()
    source, _ = tensors.reduction_input(t, ReduceOp.SUM, "allreduce", copy=True)
    assert source.ctypes.data != t.data_ptr()  # in place: the input is kept apart from the result
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    widened, dtype = tensors.reduction_input(b, ReduceOp.SUM, "allreduce", copy=False)
    assert dtype is DType.BFLOAT16 and widened.dtype.name == "float32" and widened.tolist() == [1.5, -2.0]
    assert tensors.moved(b).dtype.name == "int16"  # moved bit for bit as its patterns
    assert tensors.shares_memory(t[2:], t[:3]) and not tensors.shares_memory(t[3:], t[:3])


def test_what_a_reduction_cannot_take_is_refused_by_name() -> None:
    with pytest.raises(CcoError, match="contiguous"):
        tensors.check(torch.ones(4, 4).t(), "allreduce")
    with pytest.raises(CcoError, match=r"no element type for torch\.complex64"):
        tensors.check(torch.ones(2, dtype=torch.complex64), "allreduce")
    with pytest.raises(CcoError, match=r"SUM of torch\.uint8"):
        tensors.reduction_input(torch.ones(2, dtype=torch.uint8), ReduceOp.SUM, "allreduce", copy=False)
    source, _ = tensors.reduction_input(
        torch.ones(2, dtype=torch.bool), ReduceOp.MAX, "allreduce", copy=False
    )
    assert source.dtype.name == "int8"
    assert (
        tensors.reduction_input(torch.ones(2, dtype=torch.uint8), ReduceOp.BXOR, "x", copy=False)[0].size == 2
    )
