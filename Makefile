# ferroce: the two commands of the README, and helpers.
#   make demo   - install what is missing, build, run the main job on the embedded default
#   make test   - install what is missing, run every test (unit, integration, interop)
CARGO ?= cargo

.PHONY: deps test-deps demo test lint bench fmt

deps:
	@bash scripts/deps.sh

test-deps:
	@bash scripts/deps.sh --with-interop

demo: deps
	@bash scripts/demo.sh

test: test-deps
	$(CARGO) test --workspace --no-fail-fast

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

bench: deps
	$(CARGO) bench --workspace

fmt:
	$(CARGO) fmt --all
