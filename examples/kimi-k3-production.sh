#!/bin/sh
# A realistic Kimi-K3 production start command, as an example input for
#   kk3evidence minimize --file examples/kimi-k3-production.sh -o k3-plan.toml
# It mixes what starts the engine (TP 8, remote code, memory budget, weight format) with
# serving features (prefix caching, speculative decoding, tool and reasoning parsers), load
# settings (context length, sequences) and the business wrapper (API key, served name, CORS).
# Parser names are the ones vLLM 0.32 registers (kimi_k2 / kimi_k3 for tools and reasoning).
VLLM_ENGINE_READY_TIMEOUT_S=3600 vllm serve moonshotai/Kimi-K3 \
  --tensor-parallel-size 8 \
  --trust-remote-code \
  --gpu-memory-utilization 0.95 \
  --load-format fastsafetensors \
  --enable-prefix-caching \
  --enable-auto-tool-choice \
  --tool-call-parser kimi_k3 \
  --reasoning-parser kimi_k3 \
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}' \
  --max-model-len 262144 \
  --max-num-seqs 256 \
  --max-num-batched-tokens 16384 \
  --enable-prompt-tokens-details \
  --uvicorn-log-level warning \
  --served-model-name kimi-k3 \
  --api-key "$VLLM_API_KEY" \
  --allowed-origins '["https://chat.example.com"]' \
  --host 0.0.0.0 \
  --port 8000
