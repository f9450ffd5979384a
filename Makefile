# CortexFS: `make demo` shows it working, `make test` runs every test (CI runs `make test`).
SHELL := bash
CARGO ?= cargo
CTX := target/debug/ctx
FUZZ_SECONDS ?= 30
FUZZ_TARGETS := policy_v0 manifest control_files package_toml package_record context_pack mcp_frame mcp_config receipt_request control_request commit_evidence log_recovery queue_lease model_driver term_mode term_turn agent_socket journal_scan usage_lines oauth_redirect launch_profile ring_entry classify_names

PREFIX ?= /usr/local
BINS := ctx tsh ctxterm cortexfs-core ctxmcp

.PHONY: all build install install-files demo demo-clean test lint fuzz-smoke bench bench-all

all: build

build:
	$(CARGO) build --workspace --bins
	$(CTX) generate man target/man

# Installs the binaries, the man pages (man ctx, man ctx-agent-start, ...) and the completions
# of bash, zsh and fish under $(DESTDIR)$(PREFIX).
install:
	$(CARGO) build --release --workspace --bins
	$(MAKE) install-files FROM=target/release

# The install without a build, from the binaries in $(FROM).
FROM ?= target/release
install-files:
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
	  $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions \
	  $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	for b in $(BINS); do install -m 0755 $(FROM)/$$b $(DESTDIR)$(PREFIX)/bin/$$b || exit 1; done
	$(FROM)/ctx generate man $(DESTDIR)$(PREFIX)/share/man/man1
	$(FROM)/ctx completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/ctx
	{ $(FROM)/ctx completions zsh; echo '_clap_dynamic_completer_ctx "$$@"'; } > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_ctx
	$(FROM)/ctx completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/ctx.fish

demo:
	@CARGO="$(CARGO)" scripts/need-cargo demo
	@scripts/install-deps demo
	@scripts/host-setup
	$(CARGO) build --workspace --bins
	@scripts/demo

# Takes back what `make demo` made: its agent terminal, its work directory, the server it
# started (and its mount), its temporary storage, and the objects it added to a storage.
demo-clean:
	@scripts/demo-clean

test:
	@CARGO="$(CARGO)" scripts/need-cargo test
	@scripts/install-deps test
	@scripts/host-setup
	@CARGO="$(CARGO)" scripts/install-test-tools
	$(CARGO) fmt --all -- --check
	@CARGO="$(CARGO)" scripts/layers
	$(CARGO) fetch --quiet
	$(CARGO) deny --offline --log-level error check bans licenses sources
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet
	$(CARGO) check --manifest-path fuzz/Cargo.toml --quiet
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace
	# The mount and POSIX tests again over /dev/fuse (the run above serves them over io_uring).
	CTX_TRANSPORT=dev $(CARGO) test -p tests --test main -- mount:: posix::

# Runs every fuzz target for FUZZ_SECONDS each (nightly toolchain, cargo-fuzz).
fuzz-smoke:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p corpus/$$t && \
	  $(CARGO) +nightly fuzz run $$t corpus/$$t seeds/$$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

# The whole-system benchmarks behind bench/report.md (tables and SVG charts of each ratio),
# with libfuse's passthrough_ll as a peer; `make bench-all` runs every benchmark.
REPORT_BENCHES := server_fs appends_ctx tsh_run server_views

bench:
	@scripts/install-deps bench
	@scripts/host-setup
	$(CARGO) build --release --workspace --bins
	@scripts/bench-peers
	@rm -rf target/bench-results
	@n=0; for b in $(REPORT_BENCHES); do n=$$((n+1)); \
	  printf '\n== make bench: [%d/%d] %s\n' $$n $(words $(REPORT_BENCHES)) $$b; \
	  CORTEXFS_BENCH_WRITERS=1,8,64,256 $(CARGO) bench -q -p bench --bench $$b || exit 1; \
	done
	$(CARGO) run -q --release -p bench --bin bench-report

bench-all: bench
	$(CARGO) bench -p bench
