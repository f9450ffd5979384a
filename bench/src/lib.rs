//! CortexFS benchmarks. Each subsystem has one divan file under `benches/`; run them all with
//! `cargo bench -p bench`. Results and the commands that produced them are in `bench/README.md`.
