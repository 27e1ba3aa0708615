# Two commands for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test bench venv native clean

# The native gRPC server front end and client channel (engine/{service,client}/native/*.cc)
# against Debian's gRPC C++ (libgrpc++-dev; `.ci/run` installs it). Without them polyindex
# falls back to grpcio.
NATIVE_SO := engine/service/_grpc_front.so engine/client/_grpc_channel.so

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch first, so nothing below can pull a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0 -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

native: $(NATIVE_SO)

# One rule for both extensions: engine/<room>/_grpc_<x>.so from engine/<room>/native/grpc_<x>.cc
define NATIVE_RULE
$(1): $(subst /_grpc_,/native/grpc_,$(1:.so=.cc)) engine/wire/native/byte_buffer.h $(STAMP)
	@pkg-config --exists grpc++ || { echo "gRPC C++ not found: apt-get install libgrpc++-dev pkg-config" >&2; exit 1; }
	g++ -O2 -std=c++17 -shared -fPIC -fvisibility=hidden -Wall -Werror -Iengine/wire/native \
	    -I$$$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['include'])") \
	    $$< -o $$@.tmp $$$$(pkg-config --cflags --libs grpc++)
	mv $$@.tmp $$@  # a new file, not rewritten in place: running servers keep the old one mapped
endef
$(foreach so,$(NATIVE_SO),$(eval $(call NATIVE_RULE,$(so))))

demo: $(STAMP)
	$(BIN)/polyindex demo --data .demo

test: native
	$(BIN)/python -m pytest -q

bench: native
	$(BIN)/python bench/bench_quality.py
	$(BIN)/python bench/bench_speed.py
	$(BIN)/python bench/bench_memory.py

clean:
	rm -rf $(VENV) .demo bench/results $(NATIVE_SO)
