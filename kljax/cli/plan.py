"""`kljax plan`: will this run fit? Per-device memory from ahead-of-time compilation on abstract shapes.

    kljax plan --config configs/paper_qwen25_7b_math.py --model known:qwen2.5-7b --mesh fsdp=64 --chip v5e
    kljax plan --config configs/paper_qwen25_7b_math.py --model known:qwen2.5-7b --chip v5p-32   # 16 chips
    kljax plan --config configs/paper_llama31_8b_math.py --model known:llama-3.1-8b --chip 8xh100 \
        --config.model.remat=full --config.rl.micro_batches=16

The mesh is given by axis sizes (`--mesh fsdp=64`, `--mesh data=2,fsdp=-1,tensor=4`; unnamed axes are
1, and -1 takes the rest of `--devices` or of the chip count). For a TPU chip (v4, v5e, v5p, v6e) with
the `tpu` extra installed (libtpu), the programs are compiled by the TPU compiler for a deviceless
slice of that many chips (`kljax.studies.tpu_topology`). Otherwise they are compiled by XLA:CPU for
that many simulated CPU devices: when this process cannot have them, the command starts itself again
with XLA_FLAGS=--xla_force_host_platform_device_count=N. With --chip the plan also gives the step's
roofline time (`kljax.studies.roofline`). See `kljax.studies.plan`.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys

import jax

from kljax.config.load import load_run_config
from kljax.errors import UserError
from kljax.parallel.distributed import parse_mesh
from kljax.studies.plan import check_plan, format_plan, make_plan, parse_chip, plan_json, resolve_model
from kljax.studies.tpu_topology import libtpu_version, tpu_devices
from kljax.util.self_command import kljax_argv
from kljax.util.threads import without_forced_devices

ACCEPTS_CONFIG_OVERRIDES = True
CHILD_ENV = "KLJAX_PLAN_CHILD"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="run config file (default: the default run)")
    parser.add_argument("--model", default=None,
                        help="model source to plan for, e.g. known:qwen2.5-7b, known:llama-3.1-8b, known:qwen3-4b, "
                             "a checkpoint dir (config.json only) (default: config.model.source)")
    parser.add_argument("--mesh", "--mesh-shape", dest="mesh", default=None,
                        help="axis sizes, e.g. fsdp=64 or data=1,fsdp=-1,tensor=4 (default: config.mesh)")
    parser.add_argument("--devices", type=int, default=None, help="device count when the mesh has a -1 axis")
    parser.add_argument("--chip", default=None,
                        help="check against a device's memory: v5e, v5p, v4, v6e, h100, h200, a100-40, a100-80; "
                             "v5e-64 / v5p-32 / 8xh100 also give the device count")
    parser.add_argument("--programs", default="train,sample,score", help="which programs to compile")
    parser.add_argument("--top", type=int, default=6, help="largest buffers to list per program (0: none)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--no-roofline", dest="roofline", action="store_false",
                        help="skip the roofline step time (its small extra compilations)")
    parser.add_argument("--cpu-compiler", action="store_true",
                        help="compile with XLA:CPU even where the TPU compiler (the tpu extra) could plan the chip")
    parser.epilog = "Config fields can be overridden, e.g. --config.rl.micro_batches=8 --config.model.remat=full."


def _resolve(args: argparse.Namespace, config) -> tuple[tuple[int, int, int], int, object]:
    if args.devices is not None and args.devices < 1:
        raise UserError(f"--devices={args.devices} must be >= 1")
    chip = parse_chip(args.chip) if args.chip else None
    if args.mesh:
        shape = parse_mesh(args.mesh)
    else:
        shape = config.mesh.shape
    if -1 not in shape:
        devices = math.prod(shape)
        if args.devices not in (None, devices):
            raise UserError(f"--devices={args.devices} but the mesh {shape} needs {devices}")
        if chip is not None and chip.devices not in (None, devices):
            raise UserError(f"--chip {args.chip} has {chip.devices} devices but the mesh {shape} needs {devices}")
    else:
        devices = args.devices or (chip.devices if chip else None)
        if devices is None:
            raise UserError(f"mesh {shape} has a -1 axis: give --devices N or a slice such as --chip v5e-64")
    return shape, devices, chip


def _have_devices(n: int) -> bool:
    """Make this process's JAX use >= n CPU devices if it still can; True when it has them."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
        jax.config.update("jax_platforms", "cpu")
    except Exception:  # the backend is already up: use what it has
        pass
    return len(jax.devices("cpu")) >= n


def _child_argv(args: argparse.Namespace, devices: int) -> list[str]:
    argv = ["plan", "--devices", str(devices), "--programs", args.programs, "--top", str(args.top)]
    for flag, value in (("--config", args.config), ("--model", args.model), ("--mesh", args.mesh),
                        ("--chip", args.chip)):
        if value is not None:
            argv += [flag, str(value)]
    if args.json:
        argv.append("--json")
    if not args.roofline:
        argv.append("--no-roofline")
    if args.cpu_compiler:
        argv.append("--cpu-compiler")
    return argv + list(getattr(args, "overrides", []))


def _reexec(args: argparse.Namespace, devices: int) -> int:
    env = dict(os.environ)
    flags = without_forced_devices(env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env[CHILD_ENV] = "1"
    return subprocess.call(kljax_argv(_child_argv(args, devices)), env=env)  # nothing from the working directory


def run(args: argparse.Namespace) -> int:
    overrides = list(getattr(args, "overrides", []))
    if args.model:
        overrides.append(f"--config.model.source={args.model}")
    config = load_run_config(args.config, overrides)
    resolve_model(config.model)  # an unknown model is named before the mesh is checked against it
    shape, devices, chip = _resolve(args, config)
    check_plan(config, shape, devices)  # fail before compiling (or starting a child process)
    programs = tuple(p.strip() for p in args.programs.split(",") if p.strip())
    tpu = chip is not None and chip.is_tpu and not args.cpu_compiler
    if tpu and libtpu_version() is None:
        tpu = False
        print(f"kljax plan: the tpu extra (libtpu) is not installed: planning {chip.name} with XLA:CPU, whose "
              "temporaries are upper bounds; pip install 'kljax[tpu]' for the TPU compiler", file=sys.stderr)
    if tpu:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the deviceless slice needs no TPU backend
        plan = make_plan(config, shape, devices=tpu_devices(chip, devices), chip=chip, programs=programs,
                         top=args.top, roofline=args.roofline)
    else:
        if not _have_devices(devices):
            if os.environ.get(CHILD_ENV):
                raise UserError(f"could not get {devices} simulated CPU devices")
            return _reexec(args, devices)
        plan = make_plan(config, shape, devices=jax.devices("cpu")[:devices], chip=chip, programs=programs,
                         top=args.top, roofline=args.roofline)
    print(plan_json(plan) if args.json else format_plan(plan))
    return 0 if plan.fits() in (None, True) else 1
