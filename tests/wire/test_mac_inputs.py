"""Input checks of the MAC module (cco/wire/mac.py) that the payload tests do not reach.

The MAC's arithmetic is pinned by the payload and vector tests; these are the
refusals around it, each of which a mutation run found unasserted.
"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from cco.wire import mac


@pytest.mark.parametrize(("k1", "k2"), [(31, 32), (32, 31), (33, 32), (32, 33), (0, 0)])
def test_group_keys_are_32_bytes_each(k1: int, k2: int) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        mac.GroupKeys(bytes(k1), bytes(k2))
    assert repr(mac.GroupKeys(bytes(32), bytes(range(32)))) == "GroupKeys(<secret>)"


@pytest.mark.parametrize("elements", [0, 1, 5, 1000])
def test_keystream_is_the_first_8n_bytes_of_aes_ctr_from_zero(elements: int) -> None:
    key_m = bytes(range(32))
    expected = Cipher(algorithms.AES(key_m), modes.CTR(bytes(16))).encryptor().update(bytes(8 * elements))
    assert mac.keystream(key_m, elements) == expected
