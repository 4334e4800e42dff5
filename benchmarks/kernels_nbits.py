"""MatMulNBits (4-bit, block 32, symmetric): our native kernel vs onnxruntime on the same node, side by side.

For each (K, N), M and accuracy level: ours with every thread and with one, onnxruntime with
intra_op_num_threads 1 and 2 (its best counts as "ort"); at level 4 also ours in our own int8 order
(``fast``, opt-in through ONNX_PREPARED_NBITS_ORDER=fast: not onnxruntime's bits, so whole models drift
from it; the default is onnxruntime's order, matmul_nbits.int8_order), every thread, column "fast/ort".
Times are medians of interleaved rounds in one
process, so a loaded machine slows every side alike: read the ratios. Also printed: the machine's memory
read bandwidth (a native read loop over a buffer far larger than the caches, every thread), the weight
bytes per second at M=1 with warm caches (next to a plain read of the same packed bytes by the pool, timed in
the same rounds: the ceiling of a warm call), with the weights from memory (round robin over copies of them far
larger than the caches: the bandwidth goal, ROTATE_BYTES) and with every cache flushed before each call,
prepack speed, and the load average before and after.

NOTE (the "thr x" column, ours on one thread / ours on every thread, on a shared machine): Linux puts each
session in an autogroup and shares the CPUs between autogroups, not between threads, so while other sessions
keep the cores busy this process gets about one autogroup's share whatever its thread count, and "thr x"
reads about 1.0 or below. Measured on the 2-core EPYC at load 4.5-5.5, the same build in the same minutes
(1024x3072 and 2816x1024, levels 0 and 4, M = 1, 16, 128, 24 cells each): 0.54-1.79, median 0.98, in the
caller's session; 1.17-1.96, median 1.77, in a session of its own with autogroup nice -19. In such a session
the builds before the pool's wait policy (92756e8^) and before the several-rows kernel (5348fc5^) scaled as
main does (4 shapes, 48 cells each: medians 1.88, 1.78 and 1.91 for main).
The "queued" column shows it directly: the share of the "ours" batches' time our pool's workers waited on a
run queue (their schedstat). Measured on the 2-vCPU Zen 4 at load 5-9 (level 0, M=1, 1024x3072, batches of 8
calls of ~130 us): in batches where the worker joined every call (~1.8x) it had waited 0 us; in others it
waited 1.0-1.8 ms, had run 0-0.5 ms and joined 0-5 of 8 calls (the calls then ran about as on one thread).
``--autogroup-nice`` runs the benchmark in a new session with that nice value (root for a negative one),
which measures what the code does with the cores rather than how busy the machine is; the ratios against
onnxruntime are measured in the same process either way.

    python -m benchmarks.kernels_nbits [--json] [--repeat 30] [--shapes 1024x3072,...] [--rows 1,16,128]
                                       [--autogroup-nice -19]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

SHAPES = ((1024, 3072), (1024, 1024), (1024, 5632), (2816, 1024), (1024, 32000))
ROWS = (1, 16, 128)
LEVELS = (0, 4)
BLOCK = 32
#: goals of issue 10 (ratio ours / onnxruntime): {(level, M): max ratio}
GOALS = {(4, 1): 0.8, (4, 16): 0.5, (4, 128): 0.5, (0, 1): 0.7, (0, 16): 0.7}
#: M=1 at level 4: weight bytes per second from memory, at least this share of the read bandwidth (issue 10)
BANDWIDTH_GOAL = 0.8
#: the M=1 bandwidth measurement cycles through copies of a node's packed weights of at least this many bytes
#: in all (3x the 32 MB L3 of the EPYC it was written on), so each call reads its weights from memory while
#: the interpreter's, numpy's and our code and data stay cached, as in a decode step over many layers.
#: NOTE: flushing every cache before each call instead (the earlier measure, still printed) also evicts
#: those: measured on the 2-core EPYC (load ~3.5, 2 threads, level 4, K=1024), a flushed call over 10 KB of
#: weights (N=16) took 84 us against 2.6 us warm, np.empty alone 17-22 us after a flush; N = 1024 / 3072 /
#: 5632 / 32000 read 4.9 / 15.0 / 18.7 / 22.2 GB/s flushed and 25.5 / 28.9 / 31.6 / 28.5 GB/s over copies,
#: against a read bandwidth of 25.6 GB/s.
ROTATE_BYTES = 96 << 20
#: NOTE (what this measures on a CPU with a large L3): on the 2-vCPU Xeon of 2026-12-04 (L3 480 MiB) the copies
#: fit in the L3. Per-pass medians there (K=1024 N=1024 level 4, 154 copies, 16 passes after creating them):
#: 39.3 34.8 26.1 20.4 19.1 18.6 18.6 18.5 ... us, so the one warm pass and three timed ones below land on
#: the transient (~24-27 us, "70-78 %"), and later passes read at the L3's speed. With 2400 copies (1.5 GB,
#: 3x the L3: really from memory) every pass took 29.8-31.4 us (~21 GB/s, ~60 % of the 512 MiB read
#: bandwidth), and the pool's plain read of the same copies (read_sum) 34.9-35.4 us: the kernel is at the
#: ceiling of reading 640 KB of 4 KiB pages in one job; the bandwidth probe's buffer is on huge pages.


def _model(B, scales, K, N, accuracy_level):
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=K, N=N, bits=4,
                            block_size=BLOCK, accuracy_level=accuracy_level)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "S")],
    )
    ops = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=ops).SerializeToString()


#: seconds each batch waits before it starts, so that the previous batch's waiting threads are idle
SETTLE_S = 0.05
#: untimed calls before each batch. NOTE: setting the thread count restarts our pool's workers, and the
#: first jobs after that can run on the caller alone (pool.c, the NOTE on resizes); a run does not resize
#: between calls. In a session of its own (1024x3072, load 3-6), ours on 2 threads vs 1 at M=16 was 1.19x
#: (level 0) and 1.45x (level 4) after one warm-up call, 1.99x and 2.01x after three.
WARM_CALLS = 3


#: the native pool's worker threads are named so (``_native/pool.c``)
POOL_THREAD_NAME = "nb-pool"


def pool_queue_wait_ns() -> int:
    """Summed time the native pool's live workers waited on a run queue (/proc/self/task/*/schedstat, field 2;
    0 where /proc is absent). Counted when a worker gets a CPU, so a wait still running is not in it yet."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                if f.read().strip() != POOL_THREAD_NAME:
                    continue
            with open(f"/proc/self/task/{t}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


def _interleaved(fns: dict, repeat: int, rounds: int = 5, settle: float = SETTLE_S, waits: dict | None = None) -> dict:
    """Median microseconds per function; functions alternate in rounds of ``repeat // rounds`` calls.

    ``waits`` (optional) receives, per function, the share of its timed calls' wall time that our pool's workers
    spent waiting on a run queue (:func:`pool_queue_wait_ns`): near 0 when a second core was free for them, near
    1 (per worker) when other processes held every core, which is when "thr x" reads about 1.0.

    ``fns`` maps a name to ``(setup, call)``; ``setup`` (e.g. a thread count) runs before each batch.
    NOTE: batches, not call-by-call alternation, and a pause of ``settle`` seconds before each batch:
    onnxruntime's intra-op threads spin for about 10-30 ms after a run (measured here with
    /proc/self/task/*/schedstat: 7-11 ms of CPU in the 10-20 ms after a 2-thread run), so a batch that
    starts right after onnxruntime's would find the second core taken by onnxruntime's spinning thread
    (our pool then runs the whole batch on one thread). Our pool's idle workers spin 50 us, then poll
    with sched_yield for 1 ms (a runnable thread gets the CPU at the next poll), then sleep (pool.c), so
    after 50 ms neither side's threads hold a core.
    """
    times: dict = {k: [] for k in fns}
    queued: dict = {k: [0, 0.0] for k in fns}  # ns waited, s timed
    per = max(1, repeat // rounds)
    for _ in range(rounds):
        for k, (setup, f) in fns.items():
            setup()
            time.sleep(settle)
            for _ in range(WARM_CALLS):
                f()
            w0, t_batch = pool_queue_wait_ns(), time.perf_counter()
            for _ in range(per):
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
            queued[k][0] += pool_queue_wait_ns() - w0
            queued[k][1] += time.perf_counter() - t_batch
    if waits is not None:
        waits.update({k: (ns * 1e-9 / s if s > 0 else 0.0) for k, (ns, s) in queued.items()})
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def _autogroup() -> str:
    try:
        with open("/proc/self/autogroup") as f:
            return f.read().strip() or "n/a"
    except OSError:
        return "n/a"


def own_autogroup(nice: int) -> None:
    """Continue in a new session (so a new autogroup, see the module docstring) of autogroup nice ``nice``.

    A process-group leader may not start a session, so then a forked child carries on and the parent exits
    with its status. Call before any thread starts."""
    if os.getsid(0) != os.getpid():
        try:
            os.setsid()
        except PermissionError:
            pid = os.fork()
            if pid:
                _, status = os.waitpid(pid, 0)
                os._exit(os.waitstatus_to_exitcode(status))
            os.setsid()
    with open("/proc/self/autogroup", "w") as f:
        f.write(str(nice))


def _solo_jobs(native) -> int:
    """Our pool's count of jobs run on the caller alone (its back-off, pool.c), 0 without the extension."""
    stats = getattr(getattr(native, "_ext", None), "pool_stats", None)
    return stats()[5] if stats is not None else 0


def read_bandwidth(native, np, threads: int, nbytes: int = 512 << 20, reps: int = 5) -> float:
    """GB/s of a parallel read of ``nbytes`` (far beyond the caches), best of ``reps``."""
    buf = np.ones(nbytes, np.uint8)
    native.set_num_threads(threads)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        native.read_sum(buf)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def run(repeat: int, shapes, rows) -> dict:
    import numpy as np
    import onnxruntime as ort

    from onnx_prepared.kernels import matmul_nbits as mm
    from onnx_prepared.kernels import native

    all_threads = native.get_num_threads()
    res: dict = {
        "dispatch_level": native.dispatch_level(), "native": native.available(), "threads": all_threads,
        "cpu_count": os.cpu_count(), "block_size": BLOCK, "onnxruntime": ort.__version__,
        "loadavg_start": _loadavg(), "autogroup": _autogroup(),
        "read_gbps": read_bandwidth(native, np, all_threads), "read_gbps_1t": read_bandwidth(native, np, 1),
        "rows": [], "cold": [],
    }
    native.set_num_threads(all_threads)
    flush = np.ones(256 << 20, np.uint8)
    rng = np.random.default_rng(0)
    for K, N in shapes:
        kb = -(-K // BLOCK)
        B = rng.integers(0, 256, (N, kb, BLOCK // 2), dtype=np.uint8)
        S = (rng.random(N * kb, dtype=np.float32) * 0.02).astype(np.float32)
        t0 = time.perf_counter()
        packed = mm.prepack_matmul_nbits(B, S, None, K=K, N=N, bits=4, block_size=BLOCK)
        prepack_s = time.perf_counter() - t0
        sessions = {}
        for level in LEVELS:
            for th in (1, 2):
                so = ort.SessionOptions()
                so.log_severity_level = 3
                so.intra_op_num_threads = th
                sessions[level, th] = ort.InferenceSession(_model(B, S, K, N, level), so,
                                                           providers=["CPUExecutionProvider"])
        for level in LEVELS:
            for M in rows:
                A = rng.standard_normal((M, K)).astype(np.float32)

                def ours(A=A, level=level, packed=packed):
                    return mm.matmul_nbits_packed(A, packed, accuracy_level=level)

                def threads(n):
                    return lambda: native.set_num_threads(n)

                def noop():
                    return None

                def ours_fast(A=A, packed=packed):
                    return native.matmul_q4(A, packed, None, mm.INT8_ORDERS["fast"])

                fns = {
                    "ours": (threads(all_threads), ours),
                    "ours_1t": (threads(1), ours),
                    **({"fast": (threads(all_threads), ours_fast)} if level == 4 else {}),
                    "ort_1t": (noop, lambda A=A, s=sessions[level, 1]: s.run(None, {"A": A})),
                    "ort_2t": (noop, lambda A=A, s=sessions[level, 2]: s.run(None, {"A": A})),
                    # the ceiling of a warm M=1 call: the same packed bytes read by the pool (no compute)
                    **({"read": (threads(all_threads), lambda d=packed.data: native.read_sum(d))} if M == 1 else {}),
                }
                waits: dict = {}
                t = _interleaved(fns, repeat, waits=waits)
                native.set_num_threads(all_threads)
                ort_best = min(t["ort_1t"], t["ort_2t"])
                ref = sessions[level, 1].run(None, {"A": A})[0]
                err = float(np.abs(ours()[0] - ref).max() / np.abs(ref).max())
                row = {"K": K, "N": N, "M": M, "level": level, "ours_us": t["ours"], "ours_1t_us": t["ours_1t"],
                       "ort_1t_us": t["ort_1t"], "ort_2t_us": t["ort_2t"], "ort_us": ort_best,
                       "ratio": t["ours"] / ort_best, "threads_speedup": t["ours_1t"] / t["ours"],
                       "rel_err": err, "goal": GOALS.get((level, M)), "packed_bytes": packed.nbytes,
                       "fast_us": t.get("fast"), "fast_ratio": t["fast"] / ort_best if "fast" in t else None,
                       "prepack_source_gbps": (B.nbytes + S.nbytes) / prepack_s / 1e9,
                       "worker_queued": waits.get("ours", 0.0)}
                if M == 1:
                    row["weight_gbps_warm"] = packed.nbytes / (t["ours"] * 1e-6) / 1e9
                    row["read_us"] = t["read"]
                res["rows"].append(row)
        # M=1 with the weights from memory: (a) round robin over copies of the packed weights far larger
        # than the caches, as a decode step meets each layer's weights (the bandwidth goal); (b) every cache
        # flushed before each call, which also evicts the interpreter's, numpy's and our code and data
        A = rng.standard_normal((1, K)).astype(np.float32)
        copies = [packed] + [dataclasses.replace(packed, data=packed.data.copy())
                             for _ in range(max(2, -(-ROTATE_BYTES // packed.nbytes)) - 1)]
        for level in LEVELS:
            time.sleep(SETTLE_S)  # onnxruntime's spinning threads (the NOTE in _interleaved)
            for q in copies:
                mm.matmul_nbits_packed(A, q, accuracy_level=level)
            ts = []
            solo0 = _solo_jobs(native)
            for _ in range(max(3, -(-max(5, repeat // 3) // len(copies)))):
                for q in copies:
                    t0 = time.perf_counter()
                    mm.matmul_nbits_packed(A, q, accuracy_level=level)
                    ts.append(time.perf_counter() - t0)
            solo, rot_calls = _solo_jobs(native) - solo0, len(ts)
            rot_us = statistics.median(ts) * 1e6
            ts = []
            for _ in range(max(5, repeat // 3)):
                native.read_sum(flush)
                t0 = time.perf_counter()
                mm.matmul_nbits_packed(A, packed, accuracy_level=level)
                ts.append(time.perf_counter() - t0)
            us = statistics.median(ts) * 1e6
            gbps, rot_gbps = packed.nbytes / (us * 1e-6) / 1e9, packed.nbytes / (rot_us * 1e-6) / 1e9
            res["cold"].append({"K": K, "N": N, "level": level, "copies": len(copies), "rotating_us": rot_us,
                                "rotating_calls": rot_calls, "rotating_solo": solo,
                                "rotating_gbps": rot_gbps, "of_read_bandwidth": rot_gbps / res["read_gbps"],
                                "flushed_us": us, "flushed_gbps": gbps,
                                "flushed_of_read_bandwidth": gbps / res["read_gbps"]})
        del copies
    ts = []
    for _ in range(max(5, repeat // 3)):  # the fixed cost of a flush: a small numpy call after one
        native.read_sum(flush)
        t0 = time.perf_counter()
        np.empty((1, 16), np.float32)
        ts.append(time.perf_counter() - t0)
    res["flushed_np_empty_us"] = statistics.median(ts) * 1e6
    res["loadavg_end"] = _loadavg()
    stats = getattr(getattr(native, "_ext", None), "pool_stats", None)
    if stats is not None:
        jobs, declined, joined, wtasks, tasks, solo = stats()
        res["pool"] = {"jobs": jobs, "declined": declined, "worker_joins": joined, "worker_tasks": wtasks,
                       "tasks": tasks, "solo": solo}
    return res


def print_table(res: dict) -> None:
    print(f"dispatch {res['dispatch_level']}, {res['threads']} threads (cpus {res['cpu_count']}), onnxruntime "
          f"{res['onnxruntime']}, block {res['block_size']}, load average {res['loadavg_start']} -> "
          f"{res['loadavg_end']}, {res['autogroup']}")
    print(f"memory read bandwidth: {res['read_gbps']:.1f} GB/s ({res['threads']} threads), "
          f"{res['read_gbps_1t']:.1f} GB/s (1 thread)")
    print(f"{'K':>5} {'N':>6} {'lvl':>3} {'M':>4} {'ours us':>9} {'1 thr us':>9} {'ort1 us':>9} {'ort2 us':>9} "
          f"{'ours/ort':>8} {'goal':>5} {'thr x':>6} {'queued':>6} {'rel err':>8} {'GB/s':>6} {'fast/ort':>8}")
    for r in res["rows"]:
        goal = f"{r['goal']:.1f}" if r["goal"] is not None else "-"
        mark = "" if r["goal"] is None else (" ok" if r["ratio"] <= r["goal"] else " MISS")
        gbps = f"{r['weight_gbps_warm']:>6.1f}" if "weight_gbps_warm" in r else f"{'':>6}"
        fast = f"{r['fast_ratio']:>8.2f}" if r.get("fast_ratio") is not None else f"{'-':>8}"
        print(f"{r['K']:>5} {r['N']:>6} {r['level']:>3} {r['M']:>4} {r['ours_us']:>9.1f} {r['ours_1t_us']:>9.1f} "
              f"{r['ort_1t_us']:>9.1f} {r['ort_2t_us']:>9.1f} {r['ratio']:>8.2f} {goal:>5} "
              f"{r['threads_speedup']:>6.2f} {r.get('worker_queued', 0.0):>6.0%} {r['rel_err']:>8.1e} {gbps} "
              f"{fast}{mark}")
    print("queued = share of the 'ours' calls' wall time our pool's workers waited for a CPU (other processes "
          "held it): where it is high, thr x says little")
    warm = [r for r in res["rows"] if r.get("read_us") is not None]
    if warm:
        print("M=1, warm (the weights in the cache where they fit): ours against a plain read of the same packed bytes "
              "by the pool on every thread (the ceiling; interleaved with the rows above):")
        for r in warm:
            print(f"  K={r['K']} N={r['N']} level {r['level']}: ours {r['ours_us']:.1f} us, read {r['read_us']:.1f} us "
                  f"({r['packed_bytes'] / (r['read_us'] * 1e-6) / 1e9:.1f} GB/s): ours at "
                  f"{r['read_us'] / r['ours_us']:.0%} of the read's speed")
    print("M=1, weights from memory: round robin over copies of the weights (code and data warm; the goal), and"
          " with every cache flushed before each call:")
    for c in res["cold"]:
        ok = "" if c["level"] != 4 else " ok" if c["of_read_bandwidth"] >= BANDWIDTH_GOAL else " MISS"
        print(f"  K={c['K']} N={c['N']} level {c['level']}: {c['rotating_us']:.1f} us over {c['copies']} copies, "
              f"{c['rotating_gbps']:.1f} GB/s = {c['of_read_bandwidth']:.0%} of the read bandwidth{ok} "
              f"({c['rotating_solo']} of {c['rotating_calls']} calls on one thread: back-off); flushed "
              f"{c['flushed_us']:.1f} us, {c['flushed_gbps']:.1f} GB/s = {c['flushed_of_read_bandwidth']:.0%}")
    print(f"  (a flush's fixed cost: np.empty((1, 16)) right after one takes {res['flushed_np_empty_us']:.1f} us)")
    pre = {(r["K"], r["N"]): r["prepack_source_gbps"] for r in res["rows"]}
    print("prepack: " + ", ".join(f"{k}x{n} {g:.2f} GB/s" for (k, n), g in pre.items()))
    if res.get("pool") is not None:
        p = res["pool"]
        print(f"pool: {p['jobs']} pooled jobs, {p['declined']} declined by a worker woken on the caller's CPU (no idle "
              f"CPU at the time: those ran on one thread), workers joined {p['worker_joins']} and ran "
              f"{p['worker_tasks']} of {p['tasks']} tasks; {p['solo']} jobs ran on the caller alone (back-off: the "
              f"workers had not shortened the last job)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=30, help="timed calls per side and cell (split in 5 rounds)")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES), help="KxN,KxN,...")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="M values, comma-separated")
    ap.add_argument("--autogroup-nice", type=int, default=None,
                    help="run in a new session of this autogroup nice (-20..19; negative needs root)")
    args = ap.parse_args(argv)
    if args.autogroup_nice is not None:
        own_autogroup(args.autogroup_nice)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    rows = [int(m) for m in args.rows.split(",") if m]
    res = run(args.repeat, shapes, rows)
    if args.json:
        print(json.dumps(res))
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
