"""Adapters that put third-party rejection samplers under the SPEC section 10 protocol.

Each adapter imports its library lazily (when a sampler is built), so importing this
package needs nothing beyond rs-verify's own dependencies.

- `rs_verify.adapters.vllm:VllmSampler`: vLLM's model runner v2 `rejection_sample`.
  `rs_verify.adapters.vllm_probe` asks it which stream family it draws and how it takes draft logits.
- `rs_verify.adapters.sglang:SglangSampler`: SGLang's Triton chain speculative-sampling verification
  (`chain_speculative_sampling_triton`), of the `explicit` stream family, inverse-CDF resampling.
- `rs_verify.adapters.vllm_v1:VllmV1Sampler`: vLLM V1's `rejection_sample`, its uniform and
  exponential noise replaced by the batch's (`explicit` family, Gumbel-max resampling).
  `rs_verify.adapters.explicit_inputs` holds what both hand their library (probabilities, drafts).
"""
