"""Where vLLM's engine init spends its time, plugin on or off: a Python stack sampler around ``LLM(...)``.

    SKINNY_GEMM_VLLM=1 python init_profile.py MODEL OUT.txt

MODEL is a catalogue slug or config.json (as for ``bench --sections vllm``). The engine runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) with the bench's arguments; a thread samples the main thread's stack every
5 ms. OUT.txt gets the init time and, for the samples after CUDA-graph capture inside
``compile_or_warm_up_model``, the functions by inclusive time and the leaf frames by self time.
"""

import collections
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
INTERVAL = 0.005


def sample(main_id: int, samples: list, stop: threading.Event) -> None:
    while not stop.is_set():
        frame = sys._current_frames().get(main_id)
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{Path(code.co_filename).name}:{code.co_name}")
            frame = frame.f_back
        samples.append((time.perf_counter(), stack[::-1]))
        time.sleep(INTERVAL)


def report(samples: list, init_s: float) -> str:
    lines = [f"init_s {init_s:.2f}  samples {len(samples)}  arm SKINNY_GEMM_VLLM={os.environ.get('SKINNY_GEMM_VLLM')}"]
    captured = [t for t, s in samples if any("capture_model" in f for f in s)]
    after = captured[-1] if captured else 0.0
    phase = [s for t, s in samples if t > after and any("compile_or_warm_up_model" in f for f in s)]
    lines.append(f"after capture, inside compile_or_warm_up_model: {len(phase) * INTERVAL:.2f} s (sampled)")
    inclusive, leaf = collections.Counter(), collections.Counter()
    for s in phase:
        for f in set(s):
            inclusive[f] += 1
        leaf[s[-1]] += 1
    lines.append("-- inclusive s --")
    lines += [f"{n * INTERVAL:8.2f}  {f}" for f, n in inclusive.most_common(60)]
    lines.append("-- leaf s --")
    lines += [f"{n * INTERVAL:8.2f}  {f}" for f, n in leaf.most_common(25)]
    # The slowest distinct call paths, trimmed to the frames below compile_or_warm_up_model.
    paths = collections.Counter()
    for s in phase:
        i = max(i for i, f in enumerate(s) if "compile_or_warm_up_model" in f)
        paths[" > ".join(s[i + 1:i + 14])] += 1
    lines.append("-- paths s --")
    lines += [f"{n * INTERVAL:8.2f}  {p}" for p, n in paths.most_common(15)]
    return "\n".join(lines) + "\n"


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    from skinny_gemm.aot.vllm_bench import model_config
    from vllm import LLM

    with tempfile.TemporaryDirectory() as tmp:
        _, folder = model_config(model, Path(tmp) / "model")
        samples, stop = [], threading.Event()
        thread = threading.Thread(target=sample, args=(threading.get_ident(), samples, stop), daemon=True)
        thread.start()
        start = time.perf_counter()
        LLM(model=str(folder), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=0,
            max_model_len=136, max_num_seqs=16, enable_prefix_caching=False, gpu_memory_utilization=0.8)
        init_s = time.perf_counter() - start
        stop.set()
        thread.join()
    text = report(samples, init_s)
    out.write_text(text)
    print(text[:3000])


if __name__ == "__main__":
    main()
