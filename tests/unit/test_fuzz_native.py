"""The worker's fuzz targets start from recorded passes (tests/fuzz/native.py): as the message for
forward_request, framed as the pass port reads it for pass_port, each alone and all on one connection."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.fuzz import native


def test_seeds_are_the_recorded_passes_as_each_target_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.bin").write_bytes(b"\x0a\x01s")
    (tmp_path / "b.bin").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a pass")
    monkeypatch.setattr(native, "PASSES", tmp_path)
    assert native.seeds("forward_request") == [b"\x0a\x01s", b""]
    framed = [struct.pack("<I", 3) + b"\x0a\x01s", b"\x00\x00\x00\x00"]
    assert native.seeds("pass_port") == [*framed, b"".join(framed)]
    with pytest.raises(KeyError, match="unknown worker fuzz target 'gguf'"):
        native.seeds("gguf")


def test_every_target_has_its_program_and_the_committed_seeds_parse(tmp_path: Path) -> None:
    """The committed seeds are real passes: each a ForwardRequest of a streamed ring."""
    from tests.unit.fake_stages import load_stubs

    assert set(native.PROGRAMS) == {"forward_request", "pass_port", "mac_frames"}
    passes = native.seeds("forward_request")
    assert passes, f"no recorded passes under {native.PASSES}"
    pb2 = load_stubs(tmp_path).pb2
    for data in passes:
        msg = pb2.ForwardRequest()
        msg.ParseFromString(data)
        assert msg.ring.stream and msg.deliver_to and len(msg.positions) == 1


def test_mac_frame_seeds_carry_a_tag_per_chunk_numbered_across_the_connection() -> None:
    """Each frame: its head, its body, then a tag per 24 KiB chunk; the tags check under the target's
    key with the chunks numbered from 0 across the frames, and not under any other numbering."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    big, empty = bytes(range(256)) * 200, b""  # 51,200 bytes: three chunks
    wire = native.mac_frames([big, empty])
    assert len(wire) == (4 + len(big) + 3 * 16) + (4 + 16)
    aead = ChaCha20Poly1305(native.MAC_KEY)

    def check(number: int, data: bytes, tag: bytes) -> None:
        aead.decrypt(bytes(4) + number.to_bytes(8, "big"), tag, data)

    head, tags = wire[:4], wire[4 + len(big) : 4 + len(big) + 48]
    chunks = [head + big[:24576], big[24576:49152], big[49152:]]
    for number, chunk in enumerate(chunks):
        check(number, chunk, tags[16 * number : 16 * number + 16])
    second = wire[4 + len(big) + 48 :]
    check(3, second[:4], second[4:])  # the empty frame: its head alone, the connection's fourth chunk
    with pytest.raises(InvalidTag):
        check(0, second[:4], second[4:])  # replayed at another number it does not check
