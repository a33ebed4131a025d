"""The stages of a request's path through a system: the systems' vocabulary, named to the engine
(engine/request.py), which moves a request only into those its job names and into its own
(`PREFILL`, `RECOMPUTE`). Their order is the order outputs list them in."""
from __future__ import annotations

from pddsim.engine.request import PREFILL, RECOMPUTE, name_stages

FRONTEND = "frontend"
PREFILL_QUEUE = "prefill_queue"
STAGES = (
    FRONTEND,          # in the serving front end before the engine sees it (HTTP, tokenisation)
    PREFILL_QUEUE,     # waiting for a prefill-side instance to admit it (batch slots, KV memory)
    PREFILL,           # prompt computation (chunked, possibly over several iterations)
    "kv_rdma",         # prompt KV crossing the cluster fabric to the instance that will stream
    "kv_wan",          # prompt KV crossing the WAN to the instance that will stream
    "relay_queue",     # waiting for an RLD to admit it
    "relay_decode",    # decoding on the RLD (catch-up handoffs included: the RLD keeps streaming)
    "handoff",         # final handoff: token IDs over the WAN, MD admission and its extend step
    "decode_queue",    # waiting for a decode instance (D or MD) to admit it
    "decode",          # decoding on the instance that streams last (D, MD or colocated)
    RECOMPUTE,         # preempted for memory: re-queued and recomputing its context
)
name_stages(STAGES)

# where a job's request waits for the instance and where it decodes there
ENTRY_STAGES = (PREFILL_QUEUE, "decode")          # a prompt's job (PD's prefill, colocated)
DECODE_STAGES = ("decode_queue", "decode")        # a job decoding a prompt computed elsewhere
RELAY_STAGES = ("relay_queue", "relay_decode")    # PDD: decoding on the RLD
