"""Sharded einfuse on 1, 2 and 4 local processes (docs/sharding.md, "Beyond one process").

    python benchmarks/multiprocess.py [--quick] [--out benchmarks/results/multiprocess.md]

For each process count n it starts n processes on 127.0.0.1 (one CPU device each) and
times the Megatron MLP with the hidden index sharded over all of them:

* jax: a multi-process JAX job (``jax.distributed.initialize``, gloo CPU collectives),
  ``ef.compile(MLP, mesh=..., shard={"f": "d"})`` under jax.jit on global arrays; the
  compiled HLO's collectives (operand bytes) are set against explain's prediction;
* torch: a gloo process group, ``ef.ein(MLP, ...)`` on DTensors (W1 ``Shard(1)``, W2
  ``Shard(0)``); the collectives torch issued (CommDebugMode) against the plan's.

Times are medians of process 0, reported as ratios to one process.  On a machine with
fewer cores than processes the processes share the cores: expect no speed-up past the
core count."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

MLP = "h[b,f] := relu(sum[d](x[b,d]*W1[d,f])); y[b,o] := sum[f](h[b,f]*W2[f,o])"


def sizes(quick):
    return (64, 256, 1024, 256) if quick else (64, 512, 2048, 512)


def data(quick):
    import numpy as np
    b, d, f, o = sizes(quick)
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s).astype(np.float32)
            for n, s in (("x", (b, d)), ("W1", (d, f)), ("W2", (f, o)))}


def timed(call, repeats):
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def child_jax(rank, n, port, quick, repeats):
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if n > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=n, process_id=rank)
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import einfuse as ef
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from sharding_checks import hlo_collectives     # the tests' HLO reader
    mesh = jax.make_mesh((n,), ("d",), axis_types=(AxisType.Auto,))
    host = data(quick)
    specs = dict(x=P(), W1=P(None, "d"), W2=P("d", None))
    arrays = {k: jax.make_array_from_callback(v.shape, NamedSharding(mesh, specs[k]),
                                              lambda i, v=v: v[i]) for k, v in host.items()}
    f = ef.compile(MLP, mesh=mesh, shard={"f": "d"})
    run = jax.jit(lambda a: f(**a))
    seconds = timed(lambda: jax.block_until_ready(run(arrays)), repeats)
    hlo = hlo_collectives(run.lower(arrays).compile().as_text())
    plan = ef.explain(MLP, mesh=mesh, shard={"f": "d"}, **arrays)
    report = dict(seconds=seconds, measured=[b for _, b in hlo],
                  kinds=[k for k, _ in hlo],
                  predicted=[m.operand_bytes for m in plan.collectives],
                  sent=[m.bytes_sent for m in plan.collectives])
    if n > 1:
        jax.distributed.shutdown()
    return report


def child_torch(rank, n, port, quick, repeats):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    import einfuse as ef
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("d",))
    host = data(quick)
    places = dict(x=[Replicate()], W1=[Shard(1)], W2=[Shard(0)])
    arrays = {k: distribute_tensor(torch.from_numpy(v), mesh, places[k])
              for k, v in host.items()}
    seconds = timed(lambda: ef.ein(MLP, **arrays).to_local(), repeats)
    with CommDebugMode() as mode:
        ef.ein(MLP, **arrays)
    plan = ef.explain(MLP, mesh=mesh, **arrays)
    report = dict(seconds=seconds, kinds=[str(k).split(".")[-1] for k, c in
                                          mode.get_comm_counts().items() for _ in range(c)],
                  predicted=[m.operand_bytes for m in plan.collectives],
                  sent=[m.bytes_sent for m in plan.collectives])
    dist.destroy_process_group()
    return report


def launch(engine, n, quick, repeats, timeout=600):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
               JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    out = tempfile.TemporaryFile()
    children = [subprocess.Popen(
        [sys.executable, __file__, "--child", engine, str(rank), str(n), str(port),
         str(int(quick)), str(repeats)], env=env, start_new_session=True,
        stdout=out if rank == 0 else subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for rank in range(n)]
    try:
        deadline = time.monotonic() + timeout
        for child in children:
            child.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for child in children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    out.seek(0)
    lines = [line for line in out.read().decode().splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{engine} with {n} processes reported nothing")
    return json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--child", nargs=6)
    args = parser.parse_args()
    if args.child:
        engine, rank, n, port, quick, repeats = args.child
        run = child_jax if engine == "jax" else child_torch
        report = run(int(rank), int(n), int(port), bool(int(quick)), int(repeats))
        print(json.dumps(report), flush=True)
        return
    repeats = 5 if args.quick else 20
    b, d, f, o = sizes(args.quick)
    lines = [f"Megatron MLP, f sharded (B={b}, D={d}, F={f}, O={o}), float32; "
             f"{os.cpu_count()} cores; one CPU device per process; median of {repeats}",
             "", "| engine | processes | time | vs 1 process | collectives | operand bytes "
             "(measured) | operand bytes (explain) | sent per device (explain) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for engine in ("jax", "torch"):
        base = None
        for n in (1, 2, 4):
            r = launch(engine, n, args.quick, repeats)
            base = base or r["seconds"]
            measured = r.get("measured")
            lines.append(
                f"| {engine} | {n} | {r['seconds'] * 1e3:.2f} ms | "
                f"{base / r['seconds']:.2f}x | {', '.join(r['kinds']) or 'none'} | "
                f"{', '.join(map(str, measured)) if measured is not None else '(not read)'}"
                f" | {', '.join(map(str, r['predicted'])) or '-'} | "
                f"{', '.join(map(str, r['sent'])) or '-'} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
