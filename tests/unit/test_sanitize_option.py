"""DGR_SANITIZE (issue 42 item 7): a build with ASan/UBSan on every object and link, a build key of its
own, an unknown sanitizer refused before any work."""

from __future__ import annotations

import pytest

from core.errors import ConfigurationError
from lanes import build, cpu
from lanes.base import BuildOptions


def test_the_sanitizers_are_read_in_one_order_and_reach_every_compile_and_link() -> None:
    options = BuildOptions.from_env({"DGR_SANITIZE": " undefined, address "})
    assert options.sanitize == "address,undefined"
    args = cpu.cmake_args(options)
    flags = "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -g"
    assert f"-DCMAKE_C_FLAGS={flags}" in args and f"-DCMAKE_CXX_FLAGS={flags}" in args
    assert "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" in args
    assert not any("sanitize" in a for a in cpu.cmake_args(BuildOptions.from_env({})))


def test_a_sanitized_build_has_a_key_of_its_own() -> None:
    def key(env: dict[str, str]) -> str:
        args = cpu.cmake_args(BuildOptions.from_env(env))
        inputs = build.key_inputs(tree_digest="t" * 40, lane="cpu", cmake_args=args, versions={}, worker="w")
        return build.build_key(inputs)

    plain, asan = key({}), key({"DGR_SANITIZE": "address,undefined"})
    assert plain != asan and asan == key({"DGR_SANITIZE": "undefined,address"})


@pytest.mark.parametrize("value", ["memory", "address,thread", "adress"])
def test_an_unknown_sanitizer_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigurationError, match=r"DGR_SANITIZE: unknown sanitizer") as caught:
        BuildOptions.from_env({"DGR_SANITIZE": value})
    assert "address, undefined" in caught.value.one_line()


def test_the_sanitizer_reports_go_to_the_workspace_dgr_work_names(tmp_path) -> None:
    """Beside the sanitized lane's build, not in the checkout's .work whatever DGR_WORK says."""
    from tests.sanitized import reports_folder

    assert reports_folder({"DGR_WORK": str(tmp_path / "w")}) == tmp_path / "w" / "sanitize"
