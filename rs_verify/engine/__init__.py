"""The engine that runs properties: the backend choice, profiles, sampler loading, the runner
(Outcome and Failure records), failure bundles, the one replay path and the example database."""
