"""``payload_verify_failures.json``: every attack an on-path aggregator could try, and
the failure it must cause at combining or at verification.

The check runs this implementation's :func:`~cco.wire.payload.combine` and
:func:`~cco.wire.payload.open_verified` on each vector and confirms the error code
and the rule named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from cco.interop import reference as ref
from cco.interop.jsonform import from_hex, header_from_json
from cco.interop.vectorfiles.common import (
    GROUP_ID,
    SECRET,
    Vector,
    checked,
    chunk_header,
    header_json,
    integers,
    ref_payload,
    run,
    verify_as_endpoint,
)
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import ChunkMessage, PartialAggregate, Result, decode_message, encode_message
from cco.wire.payload import ChunkHeader, combine, derive_group_keys, seal
from cco.wire.registries import DType, ReduceOp

FILE = "payload_verify_failures.json"
SPEC_SECTION = "mac-security"
P = ref.P


def _failure(
    name: str,
    description: str,
    mutation: str,
    *,
    stage: str,
    expected_ranks: Sequence[int],
    messages: Sequence[ChunkMessage],
    error: ErrorCode,
    check: str | None,
    base: ChunkMessage | None = None,
    own: tuple[int, list[int]] | None = None,
    extra: Vector | None = None,
) -> Vector:
    vector: Vector = {
        "name": name,
        "fail": True,
        "description": description,
        "mutation": mutation,
        "stage": stage,
        "group_secret": SECRET.hex(),
        "group_id": GROUP_ID.hex(),
        "expected_ranks": list(expected_ranks),
    }
    if base is not None:
        vector["base"] = encode_message(base).hex()
    key = "inputs" if stage == "combine" else "message"
    encoded = [encode_message(m).hex() for m in messages]
    vector[key] = encoded if stage == "combine" else encoded[0]
    if own is not None:
        vector["own_rank"], vector["own_values"] = own
    vector |= {"error_code": int(error), "error_name": error.name, "check": check}
    return vector | (extra or {})


def _ignored(
    name: str,
    description: str,
    mutation: str,
    message: ChunkMessage,
    header: ChunkHeader,
    expected_ranks: Sequence[int],
) -> Vector:
    """A message an endpoint running the operation ``header`` must ignore: neither
    accept nor fail on (another epoch's)."""
    return {
        "name": name,
        "fail": True,
        "description": description,
        "mutation": mutation,
        "stage": "verify",
        "group_secret": SECRET.hex(),
        "group_id": GROUP_ID.hex(),
        "expected_ranks": list(expected_ranks),
        "expected_header": header_json(header),
        "message": encode_message(message).hex(),
        "ignored": True,
    }


def _at_width(message: ChunkMessage, width: int) -> ChunkMessage:
    """The message with its integers written at ``width`` (not necessarily the smallest)."""
    return dataclasses.replace(message, width=width, payload=ref_payload(integers(message), width)[1])


def _with_values(message: ChunkMessage, values: list[int]) -> ChunkMessage:
    width, payload = ref_payload(values)
    return dataclasses.replace(message, width=width, payload=payload)


def _vectors() -> list[Vector]:
    keys = derive_group_keys(SECRET, GROUP_ID)
    world = range(4)
    inputs = {r: [r + 1, -(r + 2), 1000 * r, 7] for r in world}

    def contributions(header: ChunkHeader) -> list[ChunkMessage]:
        return [seal(keys, header, r, np.array(inputs[r], dtype=np.int64)) for r in world]

    header = chunk_header()
    parts = contributions(header)
    honest = combine(parts, Result)
    values = integers(honest)
    assert honest.tag is not None and parts[2].tag is not None
    everyone = list(world)
    presence = chunk_header(dtype=DType.INT8, total=1, chunk=4, quorum=3, wait_ms=250)

    def verify_failure(
        name: str, description: str, mutation: str, forged: ChunkMessage, check: str
    ) -> Vector:
        return _failure(
            name,
            description,
            mutation,
            stage="verify",
            expected_ranks=everyone,
            messages=[forged],
            error=ErrorCode.VERIFICATION_FAILED,
            check=check,
            base=honest,
        )

    changed = list(values)
    changed[1] += 1
    shifted = list(values)
    shifted[2] += P
    other_keys = derive_group_keys(bytes(32), GROUP_ID)
    second_chunk_header = chunk_header(total=8, chunk=4, index=1)
    first_chunk = combine(contributions(chunk_header(total=8, chunk=4, index=0)), Result)
    second_chunk = combine(
        [seal(keys, second_chunk_header, r, np.array(inputs[r], dtype=np.int64) * 3) for r in world], Result
    )
    replays = {
        "epoch": contributions(chunk_header(epoch=6))[3],
        "operation": contributions(chunk_header(op_id=41))[3],
        "group": seal(other_keys, chunk_header(group_id=bytes(16)), 3, np.array(inputs[3], dtype=np.int64)),
    }
    vectors = [
        verify_failure(
            "element_changed",
            "One element of an honest result changed by one.",
            "values[1] += 1, re-encoded at the smallest width",
            _with_values(honest, changed),
            "tag",
        ),
        verify_failure(
            "contributor_dropped_bitmap_kept",
            "Rank 3's contribution left out of the sum (values and tag), its bit kept.",
            "combine ranks 0..2 only, then set contributors to {0,1,2,3}",
            dataclasses.replace(combine(parts[:3], Result), contributors=bitmap_from_ranks(everyone)),
            "tag",
        ),
        verify_failure(
            "contributor_dropped",
            "Rank 3 left out entirely: the bitmap shows it.",
            "combine ranks 0..2 only",
            combine(parts[:3], Result),
            "bitmap",
        ),
        _failure(
            "presence_short_of_quorum",
            "A presence pass's Result from ranks 0 and 1 only, where at_least 3 of ranks 0..3 "
            "must be there: a quorum lets ranks be missing, but not more than it allows.",
            "combine the presence passes of ranks 0 and 1 only",
            stage="verify",
            expected_ranks=everyone,
            messages=[combine([seal(keys, presence, r, np.ones(1, dtype=np.int64)) for r in (0, 1)], Result)],
            error=ErrorCode.VERIFICATION_FAILED,
            check="bitmap",
            extra={"at_least": 3},
        ),
        _failure(
            "identical_copy_refused_by_combine",
            "Combining refuses a byte-identical second copy of rank 2's contribution: overlapping "
            "contributor sets.  (An aggregator never combines a retransmission: it recognises a copy "
            "from the same child before combining; a copy that reaches combine counts rank 2 twice.)",
            "inputs are ranks 0..3 and rank 2 again",
            stage="combine",
            expected_ranks=everyone,
            messages=[*parts, parts[2]],
            error=ErrorCode.DUPLICATE_CONTRIBUTION,
            check=None,
        ),
        _failure(
            "overlapping_sets_refused_by_combine",
            "A partial aggregate of ranks 1 and 2 combined with rank 2's contribution: the sets overlap.",
            "inputs are combine(rank 1, rank 2), rank 0 and rank 2",
            stage="combine",
            expected_ranks=everyone,
            messages=[combine(parts[1:3], PartialAggregate), parts[0], parts[2]],
            error=ErrorCode.DUPLICATE_CONTRIBUTION,
            check=None,
        ),
        _failure(
            "mismatch_before_overlap_in_combine",
            "Rank 3's contribution to another epoch offered with ranks 0..3: the headers differ and "
            "rank 3 is in two chunks.  Combining checks the headers first: OPERATION_MISMATCH.",
            "inputs are ranks 0..3 and rank 3's chunk of epoch 6",
            stage="combine",
            expected_ranks=everyone,
            messages=[*parts, replays["epoch"]],
            error=ErrorCode.OPERATION_MISMATCH,
            check=None,
        ),
        _failure(
            "tag_missing_refused_by_combine",
            "Rank 1's SUM contribution without its tag: an aggregator refuses it with INVALID_FIELD "
            "(an endpoint, verifying, would say VERIFICATION_FAILED).",
            "remove the tag (key 14) of rank 1's contribution",
            stage="combine",
            expected_ranks=everyone,
            messages=[parts[0], dataclasses.replace(parts[1], tag=None)],
            error=ErrorCode.INVALID_FIELD,
            check=None,
        ),
        _failure(
            "overlap_before_missing_tag_in_combine",
            "Rank 0 twice, the second copy without its tag: the overlap is checked before the tags.",
            "inputs are rank 0, rank 0 without tag",
            stage="combine",
            expected_ranks=everyone,
            messages=[parts[0], dataclasses.replace(parts[0], tag=None)],
            error=ErrorCode.DUPLICATE_CONTRIBUTION,
            check=None,
        ),
        _failure(
            "result_not_at_smallest_width",
            "An honest result (integers fit 2 bytes) written at width 4: not the unique encoding.  "
            "The message decodes; the endpoint fails the operation with INVALID_FIELD.",
            "re-encode the honest result's integers at width 4",
            stage="verify",
            expected_ranks=everyone,
            messages=[dataclasses.replace(honest, width=4, payload=ref_payload(values, 4)[1])],
            error=ErrorCode.INVALID_FIELD,
            check=None,
            base=honest,
        ),
        _failure(
            "bitmap_before_width",
            "Rank 3 left out (the bitmap lacks it) and the result written at width 4 where 2 would do: "
            "two rules broken.  The bitmap is checked first, so VERIFICATION_FAILED, not INVALID_FIELD.",
            "combine ranks 0..2 only, then re-encode the integers at width 4",
            stage="verify",
            expected_ranks=everyone,
            messages=[_at_width(combine(parts[:3], Result), 4)],
            error=ErrorCode.VERIFICATION_FAILED,
            check="bitmap",
            base=honest,
        ),
        _failure(
            "width_before_tag",
            "One element changed by one and the result written at width 4 where 2 would do: the width "
            "is checked before the tag, so INVALID_FIELD, not VERIFICATION_FAILED.",
            "values[1] += 1, re-encoded at width 4",
            stage="verify",
            expected_ranks=everyone,
            messages=[_at_width(_with_values(honest, changed), 4)],
            error=ErrorCode.INVALID_FIELD,
            check=None,
            base=honest,
        ),
        _ignored(
            "result_of_an_older_epoch_ignored",
            "The operation was interrupted in epoch 7 and started again in epoch 8 (expected_header); "
            "the old tree's honest Result of epoch 7 arrives late.  An endpoint ignores it: it is not "
            "counted and fails nothing (not OPERATION_MISMATCH), since its epoch is not the operation's.",
            "none: the honest Result of epoch 7, where the operation now runs in epoch 8",
            honest,
            dataclasses.replace(header, epoch=header.epoch + 1),
            everyone,
        ),
        verify_failure(
            "counted_twice",
            "Rank 2's values and tag added a second time, bitmap unchanged.",
            "values += x_2 and tag += t_2 (mod p)",
            dataclasses.replace(
                _with_values(honest, [v + x for v, x in zip(values, inputs[2], strict=True)]),
                tag=(honest.tag + parts[2].tag) % P,
            ),
            "tag",
        ),
    ]
    for what, replay in replays.items():
        vectors.append(
            _failure(
                f"replay_other_{what}_refused_by_aggregator",
                f"Rank 3's contribution to another {what} offered with ranks 0..2: the headers differ.",
                f"inputs are ranks 0..2 and rank 3's chunk of another {what}",
                stage="combine",
                expected_ranks=everyone,
                messages=[*parts[:3], replay],
                error=ErrorCode.OPERATION_MISMATCH,
                check=None,
            )
        )
        disguised = dataclasses.replace(replay, group_id=GROUP_ID, epoch=header.epoch, op_id=header.op_id)
        vectors.append(
            verify_failure(
                f"replay_other_{what}",
                f"Rank 3's contribution to another {what}, header rewritten to fit, summed with ranks 0..2.",
                "rewrite group_id, epoch and op_id of the replayed chunk, then combine",
                combine([*parts[:3], disguised], Result),
                "tag",
            )
        )
    vectors += [
        _failure(
            "chunks_swapped",
            "The result of chunk 1 delivered as chunk 0 (payload and tag moved, header of chunk 0).",
            "width, payload and tag of chunk 1's result in chunk 0's message",
            stage="verify",
            expected_ranks=everyone,
            base=first_chunk,
            error=ErrorCode.VERIFICATION_FAILED,
            check="tag",
            messages=[
                dataclasses.replace(
                    first_chunk, width=second_chunk.width, payload=second_chunk.payload, tag=second_chunk.tag
                )
            ],
        ),
        _failure(
            "chunks_swapped_index",
            "The result of chunk 1 relabelled as chunk 0.",
            "chunk_index 1 -> 0",
            stage="verify",
            expected_ranks=everyone,
            base=second_chunk,
            messages=[dataclasses.replace(second_chunk, chunk_index=0)],
            error=ErrorCode.VERIFICATION_FAILED,
            check="tag",
        ),
        verify_failure(
            "contributor_added",
            "Rank 3 never contributed; the aggregator invents a chunk for it (copying rank 0's values).",
            "combine ranks 0..2 with rank 0's chunk relabelled as rank 3",
            combine([*parts[:3], dataclasses.replace(parts[0], contributors=bitmap_from_ranks([3]))], Result),
            "tag",
        ),
        verify_failure(
            "contributor_added_outside_group",
            "A rank that is not expected (rank 9) appears in the bitmap.",
            "contributors |= {9}, tag unchanged",
            dataclasses.replace(honest, contributors=bitmap_from_ranks([*everyone, 9])),
            "bitmap",
        ),
        _failure(
            "value_shifted_by_p",
            "values[2] += p.  The tag still matches (u * p = 0 mod p): only the range check catches it.",
            "values[2] += 2^61 - 1, width 8",
            stage="verify",
            expected_ranks=everyone,
            base=honest,
            messages=[_with_values(honest, shifted)],
            error=ErrorCode.VERIFICATION_FAILED,
            check="range",
            extra={"tag_matches_without_range_check": True},
        ),
        verify_failure(
            "tag_guessed",
            "A tag changed in its lowest bit.",
            "tag ^= 1",
            dataclasses.replace(honest, tag=honest.tag ^ 1),
            "tag",
        ),
        verify_failure(
            "tag_missing",
            "The tag of a SUM result removed.",
            "tag absent",
            dataclasses.replace(honest, tag=None),
            "tag",
        ),
    ]
    max_header = chunk_header(op=ReduceOp.MAX)
    max_parts = [seal(keys, max_header, r, np.array(inputs[r], dtype=np.int64)) for r in world]
    max_result = combine(max_parts, Result)
    lowered = [v - 1 for v in integers(max_result)]
    vectors.append(
        _failure(
            "max_below_own_value",
            "A MAX result lowered below rank 3's own values (MAX carries no tag).",
            "every value -= 1",
            stage="verify",
            expected_ranks=everyone,
            base=max_result,
            messages=[_with_values(max_result, lowered)],
            error=ErrorCode.VERIFICATION_FAILED,
            check="consistency",
            own=(3, inputs[3]),
        )
    )
    return vectors


def vectors() -> list[Vector]:
    return [v | {"spec_section": SPEC_SECTION} for v in checked(FILE, _vectors(), check)]


def _check_one(v: Vector) -> list[str]:
    keys = derive_group_keys(from_hex(v["group_secret"]), from_hex(v["group_id"]))
    expected = frozenset(v["expected_ranks"])
    own = (v["own_rank"], np.array(v["own_values"], dtype=np.int64)) if "own_values" in v else None
    at_least = v.get("at_least")
    header = header_from_json(v["expected_header"]) if "expected_header" in v else None
    try:
        if v["stage"] == "combine":
            inputs = [decode_message(from_hex(m)) for m in v["inputs"]]
            combine([m for m in inputs if isinstance(m, ChunkMessage)], Result)
        else:
            message = decode_message(from_hex(v["message"]))
            if not isinstance(message, ChunkMessage):
                return ["message is not a chunk message"]
            verdict = verify_as_endpoint(keys, message, header, expected, own, at_least)
            if v.get("ignored"):
                return [] if verdict is None else ["was not ignored"]
            if verdict is None:
                return ["was ignored (another epoch)"]
    except CcoError as error:
        if v.get("ignored"):
            return [f"failed with {error.code.name}, where it must be ignored"]
        problems = []
        if int(error.code) != v["error_code"] or error.code.name != v["error_name"]:
            problems.append(f"failed with {error.code.name}, not {v['error_name']}")
        if v["check"] is not None and not error.detail.startswith(v["check"]):
            problems.append(f"failed the {error.detail.split(':')[0]} check, not {v['check']}")
        return problems
    return ["was accepted"]


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
