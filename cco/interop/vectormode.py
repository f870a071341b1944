"""``cco-interop vectors``: every vector file fed to an implementation's adapter.

The runner starts the adapter command, sends it the requests each vector needs
(:mod:`cco.interop.adapter` documents the protocol) and judges every answer
against the vector itself, never against this implementation.  A vector passes
when every answer is what the vector says, is *unsupported* when the adapter
answered "unsupported" to one of its requests (and nothing it did answer was
wrong), and fails otherwise.
"""

from __future__ import annotations

import json
import selectors
import shlex
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Json = dict[str, Any]
PASSED, FAILED, UNSUPPORTED = "passed", "failed", "unsupported"


class Unsupported(Exception):
    """The adapter lacks an operation a vector needs."""


class Mismatch(Exception):
    """An answer differs from the vector."""


class AdapterDied(Exception):
    """The adapter closed its output or did not answer in time."""


class Adapter:
    """A running adapter process speaking JSON lines."""

    def __init__(self, command: str, timeout: float = 30.0, cwd: Path | None = None) -> None:
        self.timeout = timeout
        self._next = 0
        self._proc = subprocess.Popen(
            shlex.split(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=cwd,
            bufsize=1,
        )
        self._select = selectors.DefaultSelector()
        assert self._proc.stdout is not None
        self._select.register(self._proc.stdout, selectors.EVENT_READ)

    def call(self, op: str, /, **args: Any) -> Json:
        """Send one request; its response (``ok``, ``error`` or ``unsupported``)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._next += 1
        try:
            self._proc.stdin.write(json.dumps({"id": self._next, "call": op, **args}) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise AdapterDied(f"cannot write to the adapter: {error}") from error
        if not self._select.select(self.timeout):
            raise AdapterDied(f"no answer to {op} within {self.timeout} s")
        line = self._proc.stdout.readline()
        if not line:
            raise AdapterDied("the adapter closed its output")
        try:
            response: Json = json.loads(line)
        except json.JSONDecodeError as error:
            raise Mismatch(f"{op}: the answer is not JSON: {line[:80]!r}") from error
        if response.get("id") != self._next:
            raise Mismatch(f"{op}: answer id {response.get('id')} for request {self._next}")
        if response.get("unsupported"):
            raise Unsupported(op)
        return response

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._select.close()


Call = Callable[..., Json]


def ok(response: Json, what: str) -> Json:
    if "ok" not in response:
        raise Mismatch(f"{what}: refused ({response.get('error') or response.get('bad_request')})")
    result: Json = response["ok"]
    return result


def refused(response: Json, code: int, what: str) -> None:
    if "error" not in response:
        raise Mismatch(f"{what}: accepted, must fail with code {code}")
    got = response["error"].get("code")
    if got != code:
        raise Mismatch(f"{what}: failed with code {got}, must fail with {code}")


def same(got: Any, want: Any, what: str) -> None:
    if got != want:
        raise Mismatch(f"{what}: got {str(got)[:120]}, want {str(want)[:120]}")


# --- per-file checks -----------------------------------------------------------------------


def check_message(call: Call, v: Json) -> None:
    got = ok(call("decode", message=v["encoded"]), "decode")
    same(got.get("message_type"), v["message_type"], "decode: message_type")
    same(got.get("fields"), v["fields"], "decode: fields")
    encoded = ok(call("encode", message_type=v["message_type"], fields=v["fields"]), "encode")
    same(encoded.get("message"), v["encoded"], "encode")


def check_decode_failure(call: Call, v: Json) -> None:
    refused(call("decode", message=v["encoded"], limits=v["limits"]), v["error_code"], "decode")


def check_frame(call: Call, v: Json) -> None:
    limit = v["max_message_size"]
    for bytewise in (False, True):
        how = "bytewise" if bytewise else "whole"
        response = call("unframe", framed=v["framed"], max_message_size=limit, bytewise=bytewise)
        if v.get("fail"):
            refused(response, v["error_code"], f"unframe ({how})")
        else:
            same(ok(response, "unframe").get("messages"), [v["message"]], f"unframe ({how})")
    if not v.get("fail"):
        same(
            ok(call("frame", message=v["message"], max_message_size=limit), "frame").get("framed"),
            v["framed"],
            "frame",
        )


def check_keys(call: Call, v: Json) -> None:
    got = ok(call("keys", group_secret=v["group_secret"], group_id=v["group_id"]), "keys")
    same((got.get("k1"), got.get("k2")), (v["k1"], v["k2"]), "keys")


def check_tag(call: Call, v: Json) -> None:
    got = ok(
        call("tag", group_secret=v["group_secret"], header=v["header"], rank=v["rank"], values=v["values"]),
        "tag",
    )
    same(got.get("chunk_id"), v["chunk_id"], "tag: chunk_id")
    same(got.get("tag"), v["tag"], "tag")
    check_message_json(call, v["message"])


def check_message_json(call: Call, message: Json) -> None:
    """A message given as {message_name, fields, encoded}: it encodes to its bytes."""
    fields = message["fields"]
    from cco.wire.registries import MessageType  # the registry name to code point is the draft's table

    code = int(MessageType[message["message_name"]])
    same(
        ok(call("encode", message_type=code, fields=fields), "encode").get("message"),
        message["encoded"],
        "encode",
    )


def _ranks(message: Json) -> frozenset[int]:
    return frozenset(message["contributors"])


def _combine_tree(call: Call, leaves: list[Json], parts: list[Json], result: Json) -> None:
    """Every partial aggregate and the result, recombined from the largest pieces below it."""
    items = list({m["encoded"]: m for m in [*leaves, *parts]}.values())  # a part may be a leaf passed up
    for target in [*parts, result]:
        if any(target["encoded"] == leaf["encoded"] for leaf in leaves):
            continue  # a contribution passed up unchanged: nothing was combined
        below = [m for m in items if _ranks(m) < _ranks(target)]
        inputs = [m for m in below if not any(_ranks(m) < _ranks(o) for o in below)]
        name = target["message_name"]
        got = ok(call("combine", inputs=[m["encoded"] for m in inputs], **{"as": name}), f"combine to {name}")
        same(got.get("message"), target["encoded"], f"combine to {name} {sorted(_ranks(target))}")


def check_combine(call: Call, v: Json) -> None:
    _combine_tree(call, v["contributions"], v["parts"], v["result"])
    common = {
        "group_secret": v["group_secret"],
        "group_id": v["header"]["group_id"],
        "expected_ranks": v["expected_ranks"],
        "message": v["result"]["encoded"],
        **({"at_least": v["at_least"]} if "at_least" in v else {}),
    }
    got = ok(call("verify", **common), "verify")
    same(got.get("values"), v["verified_values"], "verify")
    for verifier in v.get("verifiers", []):
        got = ok(call("verify", **common, **verifier), f"verify by rank {verifier['own_rank']}")
        same(got.get("values"), v["verified_values"], f"verify by rank {verifier['own_rank']}")


def check_payload_failure(call: Call, v: Json) -> None:
    stage = v["stage"]
    if stage == "combine":
        refused(call("combine", inputs=v["inputs"]), v["error_code"], "combine")
    elif stage == "verify":
        args = {k: v[k] for k in ("own_rank", "own_values", "expected_header", "at_least") if k in v}
        response = call(
            "verify",
            group_secret=v["group_secret"],
            group_id=v["group_id"],
            expected_ranks=v["expected_ranks"],
            message=v["message"],
            **args,
        )
        if v.get("ignored"):
            same(ok(response, "verify").get("ignored"), True, "verify: ignored")
        else:
            refused(response, v["error_code"], "verify")
    elif stage == "decode":
        refused(call("decode", message=v["message"]), v["error_code"], "decode")
    elif stage == "propose":
        wanted = ("dtype", "width", "world_size", "block_elements", "input_bits")
        refused(call("propose", **{k: v[k] for k in wanted}), v["error_code"], "propose")
    elif stage == "quantize":
        keys = ("dtype", "width", "world_size", "block_elements", "scales", "input_bits")
        refused(call("quantize", **{k: v[k] for k in keys}), v["error_code"], "quantize")
    elif stage == "sum_limit":
        refused(call("sum_limit", width=v["width"], world_size=v["world_size"]), v["error_code"], "sum_limit")
    else:
        raise Mismatch(f"unknown stage {stage!r}")


def check_wire_form(call: Call, v: Json) -> None:
    args = {k: v[k] for k in ("direction", "dtype", "kind", "op") if k in v}
    if v["direction"] == "encode":
        response = call("wire_form", world_size=v["world_size"], input_bits=v["input_bits"], **args)
        want_key = "wire"
    else:
        response = call("wire_form", contributor_count=v["contributor_count"], wire=v["wire"], **args)
        want_key = "output_bits"
    if v.get("fail"):
        refused(response, v["error_code"], f"wire_form {v['direction']}")
    else:
        same(ok(response, "wire_form").get(want_key), v[want_key], f"wire_form {v['direction']}")


def _element_bytes(dtype: int) -> int:
    return {1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 4, 8: 8}[dtype]


def _int16s(hex_text: str) -> list[int]:
    data = bytes.fromhex(hex_text)
    return [int.from_bytes(data[i : i + 2], "little", signed=True) for i in range(0, len(data), 2)]


def check_block_scale(call: Call, v: Json) -> None:
    common = {k: v[k] for k in ("dtype", "width", "world_size", "block_elements")}
    same(
        ok(call("sum_limit", width=v["width"], world_size=v["world_size"]), "sum_limit").get("sum_limit"),
        v["sum_limit"],
        "sum_limit",
    )
    size = _element_bytes(v["dtype"])
    for entry, proposals in zip(v["inputs"], v["proposals"], strict=True):
        bits = entry["input_bits"]
        mine: list[int] = []
        for start in range(0, v["total_elements"], v["chunk_elements"]):
            piece = bits[2 * size * start : 2 * size * (start + v["chunk_elements"])]
            mine += ok(call("propose", input_bits=piece, **common), "propose")["proposals"]
        same(mine, proposals, f"propose (rank {entry['rank']})")
    for scale_chunk in v["scale_pass"]:
        _combine_tree(call, scale_chunk["contributions"], scale_chunk.get("parts", []), scale_chunk["result"])
    output = ""
    for chunk in v["chunks"]:
        header = chunk["header"]  # cut at the agreed chunk size: v["agreed_chunk_elements"]
        start = header["chunk_index"] * header["chunk_elements"]
        scales = _int16s(header["scales"])
        first_block = header["chunk_index"] * -(-header["chunk_elements"] // v["block_elements"])
        same(scales, v["agreed_scales"][first_block : first_block + len(scales)], "chunk scales")
        for c in chunk["contributions"]:
            bits = v["inputs"][c["rank"]]["input_bits"]
            count = len(c["quantized"])
            piece = bits[2 * size * start : 2 * size * (start + count)]
            q = ok(call("quantize", input_bits=piece, scales=scales, **common), "quantize")["values"]
            same(q, c["quantized"], f"quantize (rank {c['rank']}, chunk {header['chunk_index']})")
            values = c["quantized"] + c["attestations"]
            got = ok(
                call("tag", group_secret=v["group_secret"], header=header, rank=c["rank"], values=values),
                "tag",
            )
            same(got.get("tag"), c["tag"], f"tag (rank {c['rank']}, chunk {header['chunk_index']})")
            check_message_json(call, c["message"])
        _combine_tree(call, [c["message"] for c in chunk["contributions"]], chunk["parts"], chunk["result"])
        verified = ok(
            call(
                "verify",
                group_secret=v["group_secret"],
                group_id=v["group_id"],
                expected_ranks=chunk["result"]["contributors"],
                message=chunk["result"]["encoded"],
            ),
            "verify",
        )["values"]
        same(verified, chunk["verified_values"], f"verify (chunk {header['chunk_index']})")
        divisor = len(chunk["result"]["contributors"]) if v["op"] == 2 else 1
        out = ok(
            call(
                "dequantize",
                dtype=v["dtype"],
                values=verified,
                scales=scales,
                block_elements=v["block_elements"],
                divisor=divisor,
            ),
            "dequantize",
        )
        output += out["output_bits"]
    same(output, v["output_bits"], "decoded output")


def check_live_input(call: Call, v: Json) -> None:
    args = {k: v[k] for k in ("seed", "case", "rank", "dtype", "elements")}
    same(ok(call("live_input", **args), "live_input").get("input_bits"), v["input_bits"], "live_input")


CHECKS: dict[str, Callable[[Call, Json], None]] = {
    "messages.json": check_message,
    "decode_failures.json": check_decode_failure,
    "framing.json": check_frame,
    "payload_keys.json": check_keys,
    "payload_tags.json": check_tag,
    "payload_combine.json": check_combine,
    "payload_verify_failures.json": check_payload_failure,
    "block_scale_failures.json": check_payload_failure,
    "wire_forms.json": check_wire_form,
    "block_scale.json": check_block_scale,
    "live_inputs.json": check_live_input,
    "live_cases.json": check_live_input,
}
"""How each vector file is fed to an adapter."""


@dataclass
class FileReport:
    file: str
    outcomes: dict[str, str] = field(default_factory=dict)  # vector name -> passed/failed/unsupported
    reasons: dict[str, str] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)

    def line(self) -> str:
        return (
            f"{self.file}: {len(self.outcomes)} vectors, {self.count(PASSED)} passed, "
            f"{self.count(FAILED)} failed, {self.count(UNSUPPORTED)} unsupported"
        )


def _vectors(directory: Path, name: str) -> Iterator[Json]:
    yield from json.loads((directory / name).read_text(encoding="utf-8"))


def run(command: str, directory: Path, timeout: float = 30.0) -> list[FileReport]:
    """Feed every vector of ``directory`` to the adapter ``command``."""
    reports = []
    adapter: Adapter | None = Adapter(command, timeout)
    try:
        for file_name, check in CHECKS.items():
            if not (directory / file_name).is_file():
                continue
            report = FileReport(file_name)
            reports.append(report)
            for vector in _vectors(directory, file_name):
                name = vector["name"]
                if adapter is None:
                    report.outcomes[name], report.reasons[name] = FAILED, "the adapter died earlier"
                    continue
                try:
                    check(adapter.call, vector)
                    report.outcomes[name] = PASSED
                except Unsupported as op:
                    report.outcomes[name], report.reasons[name] = UNSUPPORTED, f"operation {op} unsupported"
                except (Mismatch, KeyError, TypeError, ValueError) as error:
                    report.outcomes[name], report.reasons[name] = FAILED, f"{type(error).__name__}: {error}"
                except AdapterDied as error:
                    report.outcomes[name], report.reasons[name] = FAILED, str(error)
                    adapter.close()
                    adapter = None
    finally:
        if adapter is not None:
            adapter.close()
    return reports


def as_json(reports: list[FileReport]) -> Json:
    return {
        r.file: {
            "passed": r.count(PASSED),
            "failed": r.count(FAILED),
            "unsupported": r.count(UNSUPPORTED),
            "vectors": {
                n: {"outcome": o, **({"reason": r.reasons[n]} if n in r.reasons else {})}
                for n, o in r.outcomes.items()
            },
        }
        for r in reports
    }
