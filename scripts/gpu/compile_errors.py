"""Provoke real compile / CUDA-graph failures through PyTorch and Triton on an NVIDIA GPU.

Usage: python3 compile_errors.py MODE
Modes:
  graph-sync     a host sync (.item()) inside torch.cuda.graph capture
  graph-oom      CUDA graph capture that allocates more than the GPU holds
  dynamo-break   torch.compile(fullgraph=True) on code with a graph break (vLLM compiles fullgraph)
  triton-error   a @triton.jit kernel with a type error in its body
"""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    print(f"{time.strftime('%m-%d %H:%M:%S')} [compile_errors.py] {msg}", flush=True)


def main() -> None:
    mode = sys.argv[1]
    import torch

    log(f"torch {torch.__version__} cuda {torch.version.cuda} mode={mode}")
    if mode in ("graph-sync", "graph-oom"):
        x = torch.randn(1024, 1024, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                y = x @ x
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        log("Capturing CUDA graph for batch size 1024")
        with torch.cuda.graph(g):
            y = x @ x
            if mode == "graph-sync":
                if y.sum().item() > 0:  # host sync: not allowed while capturing
                    y = y * 2
            else:
                z = torch.empty(300 * 1024**3, dtype=torch.uint8, device="cuda")
                y = y + z[:1].float()
        g.replay()
        log("unexpected success")
    elif mode == "dynamo-break":

        def layer(h: torch.Tensor) -> torch.Tensor:
            h = torch.relu(h)
            if h.sum().item() > 0:  # data-dependent branch: a graph break
                h = h * 2
            return h

        compiled = torch.compile(layer, fullgraph=True)
        log("compiling model forward with torch.compile(fullgraph=True)")
        out = compiled(torch.randn(8, 8, device="cuda"))
        log(f"unexpected success {out.shape}")
    elif mode == "triton-error":
        import triton
        import triton.language as tl

        @triton.jit
        def fused_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            offs = pid * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n)
            y = tl.dot(x, x)  # tl.dot needs 2-D blocks: compile-time error
            tl.store(y_ptr + offs, y, mask=offs < n)

        x = torch.randn(4096, device="cuda")
        y = torch.empty_like(x)
        log("launching fused_kernel")
        fused_kernel[(4,)](x, y, x.numel(), BLOCK=1024)
        torch.cuda.synchronize()
        log("unexpected success")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
