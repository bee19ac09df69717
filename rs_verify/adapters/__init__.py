"""Adapters that put third-party rejection samplers under the SPEC section 10 protocol.

Each adapter imports its library lazily (when a sampler is built), so importing this
package needs nothing beyond rs-verify's own dependencies.

- `rs_verify.adapters.vllm:VllmSampler`: vLLM's model runner v2 `rejection_sample`.
  `rs_verify.adapters.vllm_probe` asks it which stream family it draws and how it takes draft logits.
"""
