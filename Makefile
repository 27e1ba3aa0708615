# Two commands for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# setuptools' notice that an editable install uses a path finder is not something to act on
export PYTHONWARNINGS := ignore:Editable installation

.PHONY: demo test test-fast bench venv native native-deps browser-deps clean

# The native gRPC server front end and client channel (engine/{service,client}/native/*.cc)
# against Debian's gRPC C++. `pip install` builds them too when it finds gRPC C++ (setup.py);
# without them polyindex falls back to grpcio.
NATIVE_SO := engine/service/_grpc_front.so engine/client/_grpc_channel.so
# The benches' light gRPC load client (bench/native/grpc_load.cc; bench/load_client.py).
GRPC_LOAD := build/grpc_load
GRPC_PKGS := libgrpc++-dev pkg-config g++

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch first, so nothing below can pull a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0 -e '.[dev,ray,plot,hdf5]'
	touch $(STAMP)

venv: $(STAMP)

# Debian packages installed where we may (root, or sudo without a password, and apt-get;
# NO_APT=1 opts out); otherwise one line saying why. $(1): the check that they are there,
# $(2): the packages, $(3): who asks, $(4): what happens without them.
define APT_INSTALL
	@$(1) && exit 0; \
	if [ -n "$(NO_APT)" ]; then why="NO_APT is set"; \
	elif ! command -v apt-get >/dev/null; then why="no apt-get on this machine"; \
	elif [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo"; \
	else why="not root, and no sudo without a password"; fi; \
	if [ -z "$$why" ]; then \
	    echo "$(3): installing $(2) (apt-get)"; \
	    $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	        $$sudo apt-get install -y -qq $(2) >/dev/null || why="apt-get install failed"; \
	fi; \
	[ -z "$$why" ] || echo "$(3): $(2) not installed ($$why): $(4)"
endef

# gRPC C++ for the native front end and channel (else polyindex uses grpcio).
native-deps:
	$(call APT_INSTALL,pkg-config --exists grpc++ 2>/dev/null && command -v g++ >/dev/null,$(GRPC_PKGS),native,polyindex uses grpcio)

# Headless Chromium for the web console's browser tests (tests/test_console_browser.py).
browser-deps:
	$(call APT_INSTALL,command -v chromium >/dev/null,chromium,console tests,the browser tests skip)

native: native-deps $(STAMP)
	@if pkg-config --exists grpc++ 2>/dev/null && command -v g++ >/dev/null; then \
	    $(MAKE) --no-print-directory $(NATIVE_SO) $(GRPC_LOAD); fi

# One rule for both extensions: engine/<room>/_grpc_<x>.so from engine/<room>/native/grpc_<x>.cc
define NATIVE_RULE
$(1): $(subst /_grpc_,/native/grpc_,$(1:.so=.cc)) engine/wire/native/byte_buffer.h
	g++ -O2 -std=c++17 -shared -fPIC -fvisibility=hidden -Wall -Werror -Iengine/wire/native \
	    -I$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['include'])") \
	    $$< -o $$@.tmp $$(pkg-config --cflags --libs grpc++)
	mv $$@.tmp $$@  # a new file, not rewritten in place: running servers keep the old one mapped
endef
$(foreach so,$(NATIVE_SO),$(eval $(call NATIVE_RULE,$(so))))

$(GRPC_LOAD): bench/native/grpc_load.cc
	mkdir -p $(@D)
	g++ -O2 -std=c++17 -Wall -Werror $< -o $@.tmp $$(pkg-config --cflags --libs grpc++)
	mv $@.tmp $@

demo: $(STAMP)
	$(BIN)/polyindex demo --data .demo

# Both tiers; the budget is 25 minutes on a 2-core machine (README, "Tests"). The 25 slowest
# steps are listed at the end, so a run over budget says where its time went.
test: native browser-deps
	$(BIN)/python -m pytest -q --durations=25

# The fast tier alone, for a quick check while working: no embedding model, no fault campaign.
test-fast: native
	$(BIN)/python -m pytest -q -m "not slow"

bench: native
	$(BIN)/python bench/bench_quality.py
	$(BIN)/python bench/bench_speed.py
	$(BIN)/python bench/bench_memory.py

clean:
	rm -rf $(VENV) .demo bench/results build $(NATIVE_SO)
