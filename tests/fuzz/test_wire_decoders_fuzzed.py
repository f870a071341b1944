"""Every decoder of the wire layer, fed random and mutated bytes (issue 41, item 4).

Each target of :mod:`wire_targets` gets ``INPUTS_PER_TARGET`` inputs from Hypothesis,
drawn in batches (a batch per example: Hypothesis's own cost per example is several
times a decoder's, so batching is what makes 100,000 inputs per run affordable; a
failing batch still shrinks to the one input at fault).  The runs are derandomized
and keep no example database, so every CI run feeds the same inputs.  A target
raises on anything but a typed refusal (see :mod:`wire_targets`); the test then
fails with the input.
"""

from __future__ import annotations

from collections import Counter

import pytest
import wire_targets
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

BATCH = 16
INPUTS_PER_TARGET = 12_000
"""Nine targets: 108,000 inputs per run."""

FUZZ = settings(
    max_examples=INPUTS_PER_TARGET // BATCH,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_raw = st.binary(max_size=96)
_choices = st.binary(min_size=4, max_size=48)  # the choices a structured target reads
INPUTS: dict[str, st.SearchStrategy[bytes]] = {
    "cbor": _raw | st.sampled_from(wire_targets.corpus()),
    "cbor_mutated": _choices,
    "frames": st.binary(max_size=160),
    "varint": st.binary(max_size=9),
    "message": _raw | st.sampled_from(wire_targets.corpus()),
    "mutated_message": _choices,
    "verify": _choices,
    "combine_and_verify": _choices,
    "tensor_decoders": st.binary(min_size=8, max_size=120),
}


def test_every_target_has_inputs() -> None:
    assert set(INPUTS) == set(wire_targets.TARGETS)


@pytest.mark.parametrize("name", sorted(wire_targets.TARGETS))
def test_decoder_gives_only_typed_errors(name: str, fed: Counter[str]) -> None:
    target = wire_targets.TARGETS[name]
    outcomes: Counter[bool] = Counter()

    @FUZZ
    @given(st.lists(INPUTS[name], min_size=BATCH, max_size=BATCH))
    def run(batch: list[bytes]) -> None:
        for data in batch:
            outcomes[target(data)] += 1

    run()
    fed[name] += outcomes.total()
    assert outcomes.total() >= INPUTS_PER_TARGET, f"only {outcomes.total()} inputs were fed"
    # both ways out were taken: the target is neither refusing nor accepting everything
    if name not in ("varint",):
        assert outcomes[True] and outcomes[False], f"{name}: accepted/refused {dict(outcomes)}"
