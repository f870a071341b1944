"""Error replies always fit the wire, whatever the detail text."""

from __future__ import annotations

from cco.nodes.replies import ranks_text, refuse
from cco.wire.errors import ErrorCode
from cco.wire.messages import MAX_DETAIL, Heartbeat, clip_detail, decode_message, encode_message


def test_a_long_multibyte_detail_is_cut_to_whole_characters_within_the_limit() -> None:
    detail = "rang \u00e9\u20ac" * 400  # far over 1024 bytes, 1- to 3-byte characters
    clipped = clip_detail(detail)
    assert len(clipped.encode("utf-8")) <= MAX_DETAIL
    assert detail.startswith(clipped)
    reply = refuse("peer-1", Heartbeat(seq=1), ErrorCode.UNAUTHORIZED, detail)
    assert decode_message(encode_message(reply.message)) == reply.message


def test_short_details_and_rank_sets_are_kept() -> None:
    assert clip_detail("fine") == "fine"
    assert ranks_text({7, 0, 3}) == "{0, 3, 7}"
