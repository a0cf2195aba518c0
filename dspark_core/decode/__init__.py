"""Layer 2, decoding: the speculative loop (plain decoding is its zero-draft case), verification
policies and the hardware-aware scheduler, the batched engine, cost profiles and serving-side
calibration. Imports only from :mod:`dspark_core.core`."""
