// What a stage checks of a Forward's arguments before it changes anything (request_checks.cpp). Each
// throws StageError naming what is wrong; none reads or changes a session.
#pragma once

#include "stage_types.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace dgr {

// Bytes of one element of a boundary of this dtype.
size_t dtype_size(DType t);

// The architectures whose graph builder records every layer's input itself, the first layer's included
// (upstream's llama; 0004's deepseek4, which stages itself): their names, as a refusal says them.
bool records_every_layer_input(const std::string & arch);
extern const char * const RECORDING_ARCHITECTURES;

// The request alone against the stage: a session, 1..n_batch positions, token ids (first stage) or a
// boundary of the stage's width and the bytes its shape needs, sideband ids in the vocabulary,
// captures only of owned layers whose input the graph records.
void check_request(const StageInfo & in, const ForwardArgs & a, int32_t n_tokens);

// Positions p0, p0+1, ... with no gap (after check_request: at least one).
void check_positions(const ForwardArgs & a, int32_t n_tokens);

// A rewind from ``n_past`` back to the request's first position: at most the stage's max_rewind.
void check_rewind(const StageInfo & in, const ForwardArgs & a, int32_t n_past);

// draft / drafted: only an MTP last stage takes them, with one token id per position, fewer drafted
// tokens than the pass holds, and no more drafts than a rewind can take back.
void check_draft(const StageInfo & in, const ForwardArgs & a, int32_t n_tokens);

}  // namespace dgr
