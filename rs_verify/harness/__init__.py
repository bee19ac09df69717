"""The harness: the suite's side of one sampler, below both the properties and the engine.

- `record`: `SamplerRecord`, one frozen record of everything the suite reads from a sampler
  (SPEC section 10), built once per sampler by `record_of`, the only code that reads a
  sampler's attributes; an isolated sampler's child sends exactly this record.
- `handle`: `SamplerUnderTest`, the sampler a property runs against: the object, its record
  and the count of its calls (how the runner learns that a property called the sampler).
- `guards`: the checked call (input integrity, reseeded global generators, device faults).
- `device`: the one backend choice (CUDA or Triton's interpreter).
- `failure`: `PropertyFailure`, the failure type every property raises.
- `context`: `Context`, what a property runs against, and the capabilities it offers.
- `children`: work in a spawned child process (one command channel, one message shape, one way
  to read a death), shared by the isolated sampler, the worker pool and `timing`.

Imports the contract only (and torch or triton lazily, where a check needs them).
"""
