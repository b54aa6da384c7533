#!/bin/bash
# The generator's 8-layer fixtures at -O0 and -O2 against the lane's own build (-O1, the roster's folder):
# run in a folder holding the 8-layer source copy (test-llama-archs.cpp) and the -O1 fixtures (fixtures/).
B=/tmp/dev-work/build/cpu-57e7bd01d4f9c159; T=/tmp/dev-work/patched/896b5e9ead93b7bd
for O in -O0 -O2; do
  mkdir -p o$O
  /usr/bin/c++ -std=c++17 $O -fopenmp -I$T/include -I$T/src -I$T/common -I$T/ggml/include -I$T/vendor \
    test-llama-archs.cpp -o o$O/gen $B/llama/common/libllama-common.a $B/llama/common/libllama-common-base.a \
    $B/llama/src/libllama.a $B/llama/ggml/src/libggml.a $B/llama/ggml/src/libggml-cpu.a \
    $B/llama/ggml/src/libggml-base.a $B/llama/vendor/cpp-httplib/libcpp-httplib.a -lpthread -ldl
  o$O/gen -a qwen3next -s 1 -o o$O >/dev/null 2>&1; o$O/gen -a qwen2vl -s 1 -o o$O >/dev/null 2>&1
done
sha256sum fixtures/*.gguf o*/*.gguf | sort | awk '{print substr($1,1,16), $2}'
