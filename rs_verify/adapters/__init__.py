"""Adapters that put third-party rejection samplers under the SPEC section 10 protocol.

Each adapter imports its library lazily (when a sampler is built), so importing this
package needs nothing beyond rs-verify's own dependencies.

- `rs_verify.adapters.vllm:VllmSampler`: vLLM's model runner v2 `rejection_sample`.
  `rs_verify.adapters.vllm_probe` asks it which stream family it draws, how it takes draft logits and
  which block seed it draws; `rs_verify.adapters.vllm_convention` holds the rule for each of its
  parameters and what a release needs on a CPU (`releases.toml`: the packages each release needs, read by `rs-verify releases`).
- `rs_verify.adapters.vllm_chunks:VllmChunkedSampler`: vLLM's own chunk loop around it
  (`RejectionSampler._verify_in_chunks`), with its logprobs.
- `rs_verify.adapters.sglang:SglangSampler`: SGLang's Triton chain speculative-sampling verification
  (`chain_speculative_sampling_triton`), of the `explicit` stream family, inverse-CDF resampling.
- `rs_verify.adapters.vllm_v1:VllmV1Sampler`: vLLM V1's `rejection_sample`, its uniform and
  exponential noise replaced by the batch's (`explicit` family, Gumbel-max resampling).
  `rs_verify.adapters.explicit_inputs` holds what both hand their library (probabilities, drafts).
- `rs_verify.adapters.lmdeploy:LmdeployTritonSampler` / `LmdeployTorchSampler`: LMDeploy's Triton
  rejection kernels and its portable torch backend, the batch's noise fed to both (`explicit`).
- `rs_verify.adapters.hf_transformers:TransformersSampler`: HF transformers' `_speculative_sampling`,
  one call per request on torch's global generator, seeded per request (`own`).
"""
