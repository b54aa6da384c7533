"""A real gRPC server speaking worker/proto/shard.proto, in Python, for tests without a C++ build.

Same command line as dgr-shard-worker.  ``--model`` names a JSON file describing a toy model
({"n_layer", "n_embd", "n_vocab", "seed"}); each layer mixes the row with the running mean of the
inputs it has seen at earlier positions (a stand-in for attention over a KV cache), so staged and
monolithic runs agree only when positions, sessions and epochs are handled right.

Faults (tests inject them through the environment, optionally for one stage by its first layer):
  DGR_FAKE_FAULT=exit-at-start | no-listen | die-after-forwards:N | hang-forward | bad-shape
                 | ignore-sigterm | fail-after-forwards:N (INTERNAL "injected failure")
                 | wrong-token (a ring's last stage picks argmax + 1)
                 | kv-double (Info reports twice the KV the stage's layers hold)
  DGR_FAKE_FAULT_BEGIN=<layer>   only the stage starting at that layer misbehaves
  DGR_STUBS_DIR=<dir>            where the generated stubs live (the folder holding dgr_shard_pb)
  DGR_FAKE_N_BATCH=<n>           most positions per Forward (announced in Info; more is refused;
                                 --batch N overrides it)

A Forward with ``rewind`` set may start below the session's KV end by at most --max-rewind positions
(speculative decoding's rejected drafts): those positions are dropped first, as the C++ worker does.

Chained forwarding (ForwardRequest.deliver_to) behaves as in the C++ worker (worker/README.md): the
stage computes, then calls the next stage's Forward (or the driver's PipelineSink.Deliver) and acks;
a failure further down comes back with its code, "stage K at ADDR: CODE: ..." and the trailer
dgr-failed-stage: K.  Ring passes (ForwardRequest.ring) too: the last stage picks the argmax, and one
thread of its own delivers the token and then starts the next pass without waiting for its ack; a
failed pass is delivered as RING_FAILED naming the stage (a simpler schedule than the C++ worker's,
the same messages).  It ignores ``Ring.delivery_stream`` and always calls Deliver, as a worker that
predates the field does, so the driver's fallback to Deliver calls is held here.

``--mtp`` on the last stage stands in for the nextn block (docs/mtp.md): it verifies a pass's
``drafted`` tokens as the C++ worker does and drafts ``draft`` copies of the bonus token (the toy's
continuations mostly repeat a token, so some stand and some are rejected).  Drafting rings
(``Ring.draft``) follow worker/src/ring.cpp's ``ring_step``.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # a stub for a forked worker when the test process runs a zygote
    import fake_zygote

    fake_zygote.run_forked_if_possible(__file__)

import argparse
import json
import os
import queue
import signal
import threading
import time
from concurrent import futures

import numpy as np

sys.path.insert(0, os.environ["DGR_STUBS_DIR"])

import grpc  # noqa: E402
from dgr_shard_pb import shard_pb2 as pb  # noqa: E402
from dgr_shard_pb import shard_pb2_grpc as pbg  # noqa: E402

N_BATCH = int(os.environ.get("DGR_FAKE_N_BATCH", "512"))
FAILED_STAGE = "dgr-failed-stage"
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.enable_http_proxy", 0),
)
# What a real worker of each lane reports (ggml device name + description); the certifier refuses a
# GPU-lane run whose workers name no device of their backend (a silent CPU fallback).
FAKE_DEVICES = {"cuda": "CUDA0 (fake numpy device), CPU", "vulkan": "Vulkan0 (fake numpy device), CPU"}


class Toy:
    def __init__(self, config: dict[str, int]) -> None:
        self.n_layer, self.n_embd, self.n_vocab = config["n_layer"], config["n_embd"], config["n_vocab"]
        rng = np.random.default_rng(config.get("seed", 0))
        self.embed = rng.standard_normal((self.n_vocab, self.n_embd)).astype(np.float32)
        self.w = (rng.standard_normal((self.n_layer, self.n_embd, self.n_embd)) * 0.3).astype(np.float32)

    def layer(self, il: int, x: np.ndarray, kv: list[np.ndarray]) -> np.ndarray:
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            kv.append(x[i].copy())
            ctx = np.mean(np.stack(kv), axis=0, dtype=np.float32)
            out[i] = x[i] + np.tanh(x[i] @ self.w[il]) + np.float32(0.5) * ctx
        return out


class Servicer(pbg.ShardWorkerServicer):
    def __init__(self, toy: Toy, begin: int, end: int, args: argparse.Namespace, fault: str) -> None:
        self.toy, self.begin, self.end, self.args, self.fault = toy, begin, end, args, fault
        self.sessions: dict[str, tuple[int, dict[int, list[np.ndarray]], int]] = {}  # id -> (epoch, kv, n)
        self.forwards = 0
        self.lock = threading.Lock()
        self.channels: dict[str, grpc.Channel] = {}
        self.channels_lock = threading.Lock()
        self.ring_jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.rings_stopped: set[str] = set()
        threading.Thread(target=self._ring_loop, daemon=True).start()

    def Health(self, request, context):
        return pb.HealthReply(serving=True, status="ok")

    def Info(self, request, context):
        t = self.toy
        return pb.InfoReply(
            n_batch=self.args.batch or N_BATCH,
            worker_version="fake-0",
            llama_commit="0" * 40,
            lane=self.args.lane or "cpu",
            backend_devices=FAKE_DEVICES.get(self.args.lane or "cpu", "numpy"),
            model_path=self.args.model,
            architecture="toy",
            n_layer=t.n_layer,
            layer_begin=self.begin,
            layer_end=self.end,
            first_stage=self.begin == 0,
            last_stage=self.end == t.n_layer,
            n_embd=t.n_embd,
            boundary_width=t.n_embd,
            n_vocab=t.n_vocab,
            n_ctx=self.args.ctx,
            n_threads=self.args.threads,
            max_rewind=self.args.max_rewind,
            mtp=self.args.mtp and self.end == t.n_layer,
            transport="plaintext-insecure" if self.args.insecure else "plaintext-loopback",
            pass_frames="plaintext",
            memory=pb.MemoryAccount(
                weight_bytes=(self.end - self.begin) * t.w[0].nbytes
                + (t.embed.nbytes if self.begin == 0 else 0)
                + (t.embed.nbytes if self.end == t.n_layer else 0),
                kv_bytes=(self.end - self.begin)
                * self.args.ctx
                * t.n_embd
                * 4
                * (2 if self.fault == "kv-double" else 1),
                has_token_embedding=self.begin == 0,
                has_output_head=self.end == t.n_layer,
            ),
        )

    def Reset(self, request, context):
        with self.lock:
            return pb.ResetReply(existed=self.sessions.pop(request.session_id, None) is not None)

    def Session(self, request, context):
        with self.lock:
            held = self.sessions.get(request.session_id)
        if held is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown session '{request.session_id}'")
        epoch, kv, used = held
        state_bytes = sum(row.nbytes for rows in kv.values() for row in rows)
        return pb.SessionReply(epoch=epoch, n_past=used, state_bytes=state_bytes)

    def Tokenize(self, request, context):
        return pb.TokenizeReply(tokens=[(b % self.toy.n_vocab) for b in request.text.encode()])

    def Detokenize(self, request, context):
        return pb.DetokenizeReply(text="".join(chr(97 + t % 26) for t in request.tokens))

    def Forward(self, request, context):
        received_ns = time.monotonic_ns()
        if request.deliver_to:
            return self._chained(request, context, received_ns)
        if request.downstream:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "downstream addresses without deliver_to")
        with self.lock:
            return self._forward(request, context)

    def _channel(self, address: str) -> grpc.Channel:
        with self.channels_lock:
            if address not in self.channels:
                self.channels[address] = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            return self.channels[address]

    def _chained(self, request, context, received_ns: int):
        index, last = len(request.trace), self.end == self.toy.n_layer
        if request.capture_layers:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "capture_layers is not supported on a chained call"
            )
        if last and request.downstream:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "chained Forward: this is the last stage but "
                f"{len(request.downstream)} downstream address(es) were given",
            )
        if not last and not request.downstream:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "chained Forward: this stage is not the last but no downstream address was given",
            )
        if request.HasField("ring") and request.ring.draft:
            self._check_drafting_ring(request, context, last)
        with self.lock:
            reply = self._forward(request, context)
        hop = pb.Hop(
            stage=index,
            layer_begin=self.begin,
            layer_end=self.end,
            compute_seconds=reply.compute_seconds,
            received_ns=received_ns,
        )
        timeout = context.time_remaining()
        try:
            if not last:
                hop.boundary_bytes = len(reply.boundary.data)
                if request.keep_boundaries:
                    hop.boundary.CopyFrom(reply.boundary)
                nxt = pb.ForwardRequest(
                    session_id=request.session_id,
                    epoch=request.epoch,
                    positions=request.positions,
                    tokens=request.tokens,
                    boundary=reply.boundary,
                    boundary_dtype=request.boundary_dtype,
                    all_logits=request.all_logits,
                    downstream=request.downstream[1:],
                    deliver_to=request.deliver_to,
                    request_id=request.request_id,
                    keep_boundaries=request.keep_boundaries,
                    trace=[*request.trace, hop],
                    ring=request.ring if request.HasField("ring") else None,
                    rewind=request.rewind,
                    draft=request.draft,
                    drafted=request.drafted,
                )
                address, what = request.downstream[0], f"stage {index + 1} at {request.downstream[0]}"
                nxt.trace[-1].sent_ns = time.monotonic_ns()
                pbg.ShardWorkerStub(self._channel(address)).Forward(nxt, timeout=timeout)
            elif request.HasField("ring"):
                self._ring_on(request, reply, hop)
            else:
                delivery = pb.Delivery(request_id=request.request_id, trace=[*request.trace, hop])
                delivery.reply.logits.CopyFrom(reply.logits)
                delivery.reply.kv_used, delivery.reply.compute_seconds = reply.kv_used, reply.compute_seconds
                delivery.reply.draft[:], delivery.reply.accepted = reply.draft, reply.accepted
                address, what = request.deliver_to, f"delivering to the sink at {request.deliver_to}"
                delivery.trace[-1].sent_ns = time.monotonic_ns()
                pbg.PipelineSinkStub(self._channel(address)).Deliver(delivery, timeout=timeout)
        except grpc.RpcError as exc:
            named = dict(exc.trailing_metadata() or ()).get(FAILED_STAGE)
            if named is not None and not last:
                context.set_trailing_metadata(((FAILED_STAGE, named),))
                context.abort(exc.code(), exc.details())
            context.set_trailing_metadata(((FAILED_STAGE, str(index if last else index + 1)),))
            context.abort(exc.code(), f"{what}: {exc.code().name}: {exc.details()}")
        return pb.ForwardReply()

    def _check_drafting_ring(self, request, context, last: bool) -> None:
        draft = request.ring.draft
        if draft > self.args.max_rewind:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"ring Forward with draft {draft}: this stage "
                f"takes back at most {self.args.max_rewind} (start every stage with --max-rewind "
                f"{draft})",
            )
        if last and not self.args.mtp:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"ring Forward with draft {draft}: the last stage was started without --mtp",
            )

    def _ring_on(self, request, reply, hop) -> None:
        if request.ring.draft:
            self._drafting_ring_on(request, reply, hop)
            return
        ring = request.ring
        logits = np.frombuffer(reply.logits.data, dtype="<f4").reshape(list(reply.logits.shape))
        drifted = self.fault.startswith("wrong-token-after-forwards:") and self.forwards > int(
            self.fault.split(":")[1]
        )  # a stage that goes wrong mid-run
        token = int(np.argmax(logits[-1])) + (self.fault == "wrong-token" or drifted)
        pos = request.positions[-1] + 1
        limit = min(ring.max_position or self.args.ctx - 1, self.args.ctx - 1)
        end = (
            pb.RING_STOP_TOKEN
            if token in ring.stop_tokens
            else pb.RING_BUDGET
            if ring.budget <= 1
            else pb.RING_CONTEXT_FULL
            if pos > limit
            else pb.RING_CONTINUES
        )
        hop.sent_ns = time.monotonic_ns()
        delivery = pb.Delivery(
            request_id=request.request_id,
            trace=[*request.trace, hop],
            ring=pb.RingToken(token=token, index=ring.index, end=end),
        )
        if not ring.tokens_only or self.fault == "logits-anyway":
            delivery.reply.logits.CopyFrom(reply.logits)
        nxt = None
        if end == pb.RING_CONTINUES:
            more = pb.Ring()
            more.CopyFrom(ring)
            more.budget, more.index = ring.budget - 1, ring.index + 1
            nxt = pb.ForwardRequest(
                session_id=request.session_id,
                epoch=request.epoch,
                positions=[pos],
                tokens=[token],
                boundary_dtype=request.boundary_dtype,
                all_logits=request.all_logits,
                downstream=ring.stages[1:],
                deliver_to=request.deliver_to,
                request_id=request.request_id,
                keep_boundaries=request.keep_boundaries,
                ring=more,
            )
        self.ring_jobs.put((request.deliver_to, delivery, nxt))

    def _drafting_ring_on(self, request, reply, hop) -> None:
        """worker/src/ring.cpp's ring_step in numpy: the accepted drafts and the bonus token, cut at a
        stop token or the budget; the next pass feeds the bonus and the drafts (trimmed)."""
        ring, drafted = request.ring, request.drafted
        rows = np.frombuffer(reply.logits.data, dtype="<f4").reshape(list(reply.logits.shape))
        first = rows.shape[0] - 1 - drafted
        chosen, end = [], pb.RING_CONTINUES
        for j in range(reply.accepted + 1):
            chosen.append(int(np.argmax(rows[first + j])))
            if chosen[-1] in ring.stop_tokens or len(chosen) >= ring.budget:
                end = pb.RING_STOP_TOKEN if chosen[-1] in ring.stop_tokens else pb.RING_BUDGET
                break
        limit = min(ring.max_position or self.args.ctx - 1, self.args.ctx - 1)
        pos = request.positions[0] + len(request.positions) - drafted + reply.accepted
        if end == pb.RING_CONTINUES and pos > limit:
            end = pb.RING_CONTEXT_FULL
        drafts = list(reply.draft[: max(0, min(ring.budget - len(chosen) - 1, limit - pos))])
        hop.sent_ns = time.monotonic_ns()
        delivery = pb.Delivery(
            request_id=request.request_id,
            trace=[*request.trace, hop],
            ring=pb.RingToken(token=chosen[-1], index=ring.index, end=end, tokens=chosen, drafted=drafted),
        )
        delivery.reply.logits.CopyFrom(_tensor(rows[first : first + len(chosen)], pb.F32))
        delivery.reply.accepted = reply.accepted
        nxt = None
        if end == pb.RING_CONTINUES:
            delivery.reply.draft[:] = drafts
            more = pb.Ring()
            more.CopyFrom(ring)
            more.budget, more.index = ring.budget - len(chosen), ring.index + len(chosen)
            nxt = pb.ForwardRequest(
                session_id=request.session_id,
                epoch=request.epoch,
                tokens=[chosen[-1], *drafts],
                positions=range(pos, pos + 1 + len(drafts)),
                rewind=pos < request.positions[-1] + 1,
                draft=ring.draft,
                drafted=len(drafts),
                boundary_dtype=request.boundary_dtype,
                all_logits=request.all_logits,
                downstream=ring.stages[1:],
                deliver_to=request.deliver_to,
                request_id=request.request_id,
                keep_boundaries=request.keep_boundaries,
                ring=more,
            )
        self.ring_jobs.put((request.deliver_to, delivery, nxt))

    def _ring_loop(self) -> None:
        while True:
            sink, delivery, nxt = self.ring_jobs.get()
            rid = delivery.request_id
            if rid in self.rings_stopped and delivery.ring.end != pb.RING_FAILED:
                continue
            try:
                pbg.PipelineSinkStub(self._channel(sink)).Deliver(delivery, timeout=30)
            except grpc.RpcError:
                self.rings_stopped.add(rid)
                continue
            if nxt is not None:
                address = nxt.ring.stages[0]
                ack = pbg.ShardWorkerStub(self._channel(address)).Forward.future(nxt, timeout=30)
                ack.add_done_callback(lambda f, a=address, n=nxt: self._ring_ack(f, a, n))

    def _ring_ack(self, ack, address: str, nxt) -> None:
        exc = ack.exception()
        if exc is None or nxt.request_id in self.rings_stopped:
            return
        self.rings_stopped.add(nxt.request_id)
        named = dict(exc.trailing_metadata() or ()).get(FAILED_STAGE)
        code = exc.code().name
        detail = exc.details() if named is not None else f"stage 0 at {address}: {code}: {exc.details()}"
        failed = pb.RingToken(
            token=-1,
            index=nxt.ring.index,
            end=pb.RING_FAILED,
            failed_stage=int(named or 0),
            code=code,
            detail=detail,
        )
        self.ring_jobs.put((nxt.deliver_to, pb.Delivery(request_id=nxt.request_id, ring=failed), None))

    def _forward(self, request, context):
        t0 = time.perf_counter()
        self.forwards += 1
        if self.fault.startswith("die-after-forwards:") and self.forwards > int(self.fault.split(":")[1]):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault.startswith("fail-after-forwards:") and self.forwards > int(self.fault.split(":")[1]):
            context.abort(grpc.StatusCode.INTERNAL, f"injected failure in Forward {self.forwards}")
        if self.fault == "hang-forward":
            time.sleep(3600)
        positions = list(request.positions)
        n = len(positions)
        if self.end == self.toy.n_layer and (_draft_count(request) or request.drafted) and not self.args.mtp:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this stage drafts nothing: only the last "
                "stage of workers started with --mtp verifies and drafts",
            )
        if n > (self.args.batch or N_BATCH):
            batch = self.args.batch or N_BATCH
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{n} positions in one Forward (max {batch})")
        epoch, kv, used = self.sessions.get(request.session_id, (request.epoch, {}, 0))
        if request.session_id in self.sessions and epoch != request.epoch:
            epoch, kv, used = request.epoch, {}, 0  # a new route epoch is a cache miss
        if request.session_id not in self.sessions and positions and positions[0] != 0:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown session {request.session_id!r}")
        if request.rewind and request.session_id in self.sessions and positions and positions[0] < used:
            kv, used = self._rewound(context, kv, used, positions[0])
        if positions != list(range(used, used + n)):
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"positions {positions[:3]}... do not continue the KV at {used}",
            )
        if self.begin == 0:
            if len(request.tokens) != n:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first stage needs one token per position")
            x = self.toy.embed[np.asarray(request.tokens) % self.toy.n_vocab]
        else:
            shape = list(request.boundary.shape)
            if shape != [n, self.toy.n_embd]:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"boundary shape {shape}, expected [{n}, {self.toy.n_embd}]",
                )
            dt = "<f2" if request.boundary.dtype == pb.F16 else "<f4"
            x = np.frombuffer(request.boundary.data, dtype=dt).reshape(shape).astype(np.float32)
        captures = []
        for il in range(self.begin, self.end):
            if il in request.capture_layers:
                captures.append(pb.LayerCapture(layer=il, residual=_tensor(x, pb.F32)))
            x = self.toy.layer(il, x, kv.setdefault(il, []))
        self.sessions[request.session_id] = (epoch, kv, used + n)
        reply = pb.ForwardReply(captures=captures, kv_used=used + n)
        if self.end == self.toy.n_layer:
            drafting = request.HasField("ring") and request.ring.draft > 0  # every row chooses a token
            rows = x if request.all_logits or drafting else x[-1:]
            # row by row, as every layer above: a row's logits never depend on the rows batched with it
            reply.logits.CopyFrom(_tensor(np.stack([row @ self.toy.embed.T for row in rows]), pb.F32))
            self._draft(request, context, x, reply)
        else:
            reply.boundary.CopyFrom(_tensor(x, request.boundary_dtype or pb.F32))
        if self.fault == "bad-shape":
            target = reply.logits if self.end == self.toy.n_layer else reply.boundary
            target.shape[0] += 1
        reply.compute_seconds = time.perf_counter() - t0
        return reply

    def _draft(self, request, context, x: np.ndarray, reply) -> None:
        """The stand-in nextn block: verify the pass's drafts, then draft copies of the bonus token."""
        draft = _draft_count(request)
        if not (draft or request.drafted):
            return
        n, drafted = x.shape[0], request.drafted
        picks = [int(np.argmax(row @ self.toy.embed.T)) for row in x]
        kept = 0
        while kept < drafted and picks[n - drafted + kept - 1] == request.tokens[n - drafted + kept]:
            kept += 1
        reply.accepted = kept
        reply.draft[:] = [picks[n - drafted + kept - 1]] * draft

    def _rewound(self, context, kv: dict[int, list[np.ndarray]], used: int, to: int):
        """The session's KV without the positions from ``to`` on (the C++ worker's checks and messages)."""
        if used - to > self.args.max_rewind:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"rewind from {used} to {to} takes back {used - to} positions; this worker "
                f"takes back at most {self.args.max_rewind}",
            )
        return {il: rows[:to] for il, rows in kv.items()}, to


def _draft_count(request) -> int:
    """The drafts a last stage makes after the pass: a drafting ring's count, else ``draft``."""
    return request.ring.draft if request.HasField("ring") and request.ring.draft else request.draft


def _tensor(x: np.ndarray, dtype: int) -> pb.Tensor:
    np_dtype = "<f2" if dtype == pb.F16 else "<f4"
    return pb.Tensor(dtype=dtype, shape=list(x.shape), data=np.ascontiguousarray(x, dtype=np_dtype).tobytes())


def _stop_at_stdin_eof(stop: threading.Event) -> None:
    """Read fd 0 raw (a daemon thread inside a buffered stdin read aborts the interpreter's exit)."""
    while os.read(0, 256):
        pass
    stop.set()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--batch", type=int, default=0)  # 0: N_BATCH
    ap.add_argument("--max-sessions", type=int, default=4)
    ap.add_argument("--max-rewind", type=int, default=0)
    ap.add_argument("--mtp", action="store_true")
    ap.add_argument("--identity")
    ap.add_argument("--lane")
    ap.add_argument("--stop-on-stdin-eof", action="store_true")
    ap.add_argument("--insecure", action="store_true")  # the real worker's plaintext beyond loopback
    args = ap.parse_args()
    begin, end = (int(v) for v in args.layers.split(":"))
    fault = os.environ.get("DGR_FAKE_FAULT", "")
    only = os.environ.get("DGR_FAKE_FAULT_BEGIN")
    if only is not None and int(only) != begin:
        fault = ""
    if fault == "exit-at-start":
        print("fake worker: refusing to start", file=sys.stderr)
        sys.exit(3)
    if fault == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(args.model, encoding="utf-8") as fh:
        toy = Toy(json.load(fh))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pbg.add_ShardWorkerServicer_to_server(Servicer(toy, begin, end, args, fault), server)
    port = server.add_insecure_port(args.listen)
    server.start()
    if fault != "no-listen":
        print(f"DGR-WORKER-LISTENING 127.0.0.1:{port}", flush=True)
    stop = threading.Event()
    if fault != "ignore-sigterm":
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.stop_on_stdin_eof:  # the real worker's contract: the launcher gone, the worker stops
        threading.Thread(target=_stop_at_stdin_eof, args=(stop,), daemon=True).start()
    while not stop.wait(0.1):
        pass
    server.stop(grace=0.5).wait()


if __name__ == "__main__":
    main()
