# lit configuration for Kiln. Tests live beside this file by area.
import os
import lit.formats

config.name = "Kiln"
config.test_format = lit.formats.ShTest(not lit_config.isWindows)
config.suffixes = [".mlir", ".kiln", ".test"]
config.excludes = ["Inputs", "unit", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py.in"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.kiln_obj_root, "test")

config.environment["FILECHECK_OPTS"] = "-enable-var-scope"
# lit runs tests in parallel; the interpreter's BLAS calls stay on one thread.
config.environment["OPENBLAS_NUM_THREADS"] = "1"
# kiln-run's compiled-kernel cache, shared by the tests of one build (the
# GPT's kernels are JIT-compiled once, ~10 s, then loaded from the cache).
config.environment["KILN_CACHE_DIR"] = os.path.join(config.kiln_obj_root, "test", "kernel-cache")
config.environment["PATH"] = os.pathsep.join(
    [config.kiln_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", "")])
config.substitutions.append(("%kiln_src", config.kiln_src_root))
config.substitutions.append(("%kiln_bin", config.kiln_tools_dir))
config.substitutions.append(("%examples", os.path.join(config.kiln_src_root, "examples")))
config.substitutions.append(("%python", config.python_executable))
# Lowered code runs through upstream MLIR's CPU pipeline and runner.
config.substitutions.append(("%cpu_pipeline",
    "--one-shot-bufferize=bufferize-function-boundaries --convert-linalg-to-loops "
    "--convert-scf-to-cf --expand-strided-metadata --lower-affine "
    "--convert-math-to-libm --convert-math-to-llvm "
    "--finalize-memref-to-llvm --convert-arith-to-llvm "
    "--convert-index-to-llvm --convert-cf-to-llvm --convert-func-to-llvm "
    "--reconcile-unrealized-casts"))
config.substitutions.append(("%runner_libs",
    os.path.join(config.llvm_tools_dir, "..", "lib", "libmlir_runner_utils.so") + "," +
    os.path.join(config.llvm_tools_dir, "..", "lib", "libmlir_c_runner_utils.so")))

# CUDA: the toolkit (kilnc compiles kernels with NVRTC) and a GPU (tests
# that run on one; without it lit reports them UNSUPPORTED, never passed).
import subprocess
try:
    devices = subprocess.run([os.path.join(config.kiln_tools_dir, "kiln-run"), "devices"],
                             capture_output=True, text=True, timeout=60).stdout
except Exception as e:  # noqa: BLE001 - any failure means no GPU
    devices = ""
if "cuda[:N]" in devices:
    config.available_features.add("cuda-toolkit")
if "cuda-emu" in devices:
    config.available_features.add("cuda-emu")
if "  cuda:0 " in devices:
    config.available_features.add("cuda-gpu")
else:
    lit_config.note("no CUDA GPU here: GPU tests are UNSUPPORTED (%s)" %
                    (devices.strip().splitlines()[-1] if devices.strip() else "kiln-run devices failed"))

import shutil


def runs(*commands):
    """Whether each command runs and exits 0 in turn (False when one cannot
    start, fails or takes over 20 s)."""
    try:
        return all(subprocess.run(c, capture_output=True, timeout=20).returncode == 0
                   for c in commands)
    except Exception:  # noqa: BLE001 - no such tool, no permission: False
        return False


def has_modules(*names):
    """Whether the test Python finds every package (find_spec: without
    importing them, which takes seconds on every lit run)."""
    return runs([config.python_executable, "-c",
                 "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(n) is None"
                 " for n in sys.argv[1:]))", *names])


def feature(name, present, unsupported):
    """Adds lit feature `name`, or notes why the tests needing it are
    UNSUPPORTED."""
    if present:
        config.available_features.add(name)
    else:
        lit_config.note(unsupported)


# CI (CI=true) runs the tests that need the Python packages scripts/setup.sh
# installs, so a missing package fails them instead of hiding them.
in_ci = os.environ.get("CI") == "true"

# A real full disk: a small tmpfs mounted in a private user and mount
# namespace (unshare -rm), where the kernel allows it.
feature("tmpfs-mount",
        runs(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && touch /mnt/x"]),
        "cannot mount a tmpfs in a namespace: the full-disk test is UNSUPPORTED")

# taskset narrows a process to fewer CPUs than it may use (cpu-threads.test):
# there must be at least two to narrow.
feature("taskset", shutil.which("taskset") and len(os.sched_getaffinity(0)) >= 2,
        "no taskset or a single CPU: the thread-budget test is UNSUPPORTED")

# Network namespaces (ip netns, root): two-hosts.test simulates two hosts
# on this machine, one namespace each, joined by veth pairs on a bridge.
probe = "kiln-lit-probe-%d" % os.getpid()
feature("netns", runs(["ip", "netns", "add", probe], ["ip", "netns", "del", probe]),
        "cannot create network namespaces (ip netns add, needs root): the two-hosts test is "
        "UNSUPPORTED")

# TAP devices (/dev/net/tun, root): two-hosts-delay.test's delayed link.
feature("tap", os.access("/dev/net/tun", os.R_OK | os.W_OK),
        "no read-write /dev/net/tun (TAP devices, needs root): the delayed-link test is "
        "UNSUPPORTED")

# MPI (OpenMPI from Debian, scripts/setup.sh): multi-process tests launch
# ranks with %mpirun, which allows root and more ranks than cores.
feature("mpi", shutil.which("mpirun"),
        "no mpirun here: MPI tests are UNSUPPORTED (scripts/setup.sh installs OpenMPI)")
config.substitutions.append(("%mpirun", "mpirun --allow-run-as-root --oversubscribe"
                             " --mca btl self,vader --bind-to none"))

# TensorBoard's reader (the tensorboard package) for the tests that read
# event files back.
feature("tensorboard", has_modules("tensorboard") or in_ci,
        "no tensorboard package for %s: TensorBoard tests are UNSUPPORTED "
        "(pip install tensorboard)" % config.python_executable)

# TensorBoard's profile plugin (tensorboard-plugin-profile, which brings
# xprof) for test/tools/tensorboard-profile.test, which asks a running
# TensorBoard's Profile tab for Kiln's trace.
feature("tensorboard-profile", has_modules("xprof", "tensorboard_plugin_profile") or in_ci,
        "no tensorboard-plugin-profile package for %s: the TensorBoard Profile tab test is "
        "UNSUPPORTED (pip install tensorboard-plugin-profile)" % config.python_executable)

# PyTorch (CPU) for the tests that train the tutorial models in PyTorch
# too (test/e2e/tutorials-torch*.test); scripts/setup.sh does not install
# it, so without it those tests are UNSUPPORTED.
feature("torch", has_modules("torch"),
        "no torch package for %s: the PyTorch comparison tests are UNSUPPORTED "
        "(pip install torch)" % config.python_executable)
