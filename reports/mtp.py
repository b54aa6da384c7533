"""The report's MTP table: speculative pipeline decoding with the last stage's nextn block.

Reads ``mtp`` (certify.mtp) from each placement record: the draft length, whether every prompt's
tokens with MTP on equal the placement's plain run and whether rejected drafts left no trace (the
MTP gate's two checks), and the figures the gate does not hold: acceptance rate, tokens per verify
pass, seam crossings per token and decode tok/s with MTP on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd


def mtp_frame(placements: Sequence[Mapping[str, Any]]) -> pd.DataFrame | None:
    rows = []
    for p in placements:
        m = p.get("mtp")
        if not m:
            continue
        rows.append(
            {
                "placement": p["name"],
                "stages": p.get("n_stages"),
                "forwarding": m.get("forwarding", "relayed"),
                "drafts per pass": m["draft_tokens"],
                "MTP on == off": f"{m['prompts_identical']} of {m['prompts']} prompts",
                "rollback leaves no trace": "yes" if m["rollback_identical"] >= 1.0 else "NO",
                "acceptance": f"{m['acceptance_rate']:.2f}",
                "tokens / pass": f"{m['tokens_per_pass']:.2f}",
                "crossings / token": f"{m['crossings_per_token']:.2f}",
                "decode tok/s (MTP on)": f"{m['decode_tok_s']:.1f}",
            }
        )
    return pd.DataFrame(rows) if rows else None
