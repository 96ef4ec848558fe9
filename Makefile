# tokgate: one entry point for every build flavour.
#
#   make            build everything for this machine into build/
#   make deps       install Debian packages and fetch the pinned npm packages
#   make test       build and run every unit and integration test (cmocka)
#   make asan       the same tests in an ASan+UBSan build (build/asan/)
#   make gate       set up, build, run specs/default.yaml, print the verdicts
#   make mutants    the whole mutation suite (tests/mutants/; make test runs a subset)
#   make bench      benchmarks (tokenizer, store ingest, cpu tier vs llama.cpp)
#   make aarch64    cross build of the arm workers for aarch64 (build/aarch64/)
#   make hip        compile the GPU sources with hipcc for gfx1030 and gfx90a
#   make gpu        build the GPU arm with nvcc for sm_90 (needs CUDA)
#   make gpu-test   GPU kernel tests and the GPU gate (needs a GPU)
#   make clean      remove build/
#
# Every source directory contributes through wildcards, so adding a module
# needs no edit here: engine/*.c and engine/cpu/*.c form libtg_engine.a,
# harness/*.c (but main.c) form libtg_harness.a, tests/test_*.c are one
# cmocka program each. BUILD selects the output folder, so flavours and
# parallel builds never share objects.

BUILD    ?= build
CC       ?= gcc
ARCH     ?= $(shell uname -m)
OPT      ?= -O2
SAN      ?=
TOP      := $(CURDIR)
CACHE    ?= $(TOP)/.cache

# llama.cpp headers for tg-llama: the bundled source by default, or yours.
LLAMA_CPP_DIR ?= $(CACHE)/llama.cpp

PKGS     := sqlite3 libzstd libpcre2-8 jansson libfyaml libcrypto libxxhash
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
# libcurl (Debian libcurl4-openssl-dev) for tg-http alone, apart from PKGS
# so that a machine without it still builds everything else.
CURL_CFLAGS := $(shell pkg-config --cflags libcurl 2>/dev/null)
CURL_LIBS   := $(shell pkg-config --libs libcurl 2>/dev/null)

CPPFLAGS += -D_GNU_SOURCE -I$(TOP)/engine -I$(TOP)/harness -I$(TOP)/oracles
CFLAGS   += -std=gnu11 -g $(OPT) $(SAN) -Wall -Wextra -Wno-unused-parameter \
            -Wno-missing-field-initializers -pthread -MMD -MP $(PKG_CFLAGS)
LDFLAGS  += -pthread $(SAN)
LDLIBS   += $(PKG_LIBS) -ldl -lm

# Per-ISA kernel files: file_avx2.c, file_avx512.c, file_neon.c.
ifeq ($(ARCH),x86_64)
  ISA_SKIP := %_neon.c
else
  ISA_SKIP := %_avx2.c %_avx512.c
endif

ENGINE_SRC  := $(filter-out $(ISA_SKIP),$(wildcard engine/*.c engine/cpu/*.c))
ENGINE_OBJ  := $(ENGINE_SRC:%.c=$(BUILD)/obj/%.o)
HARNESS_SRC := $(filter-out harness/main.c,$(wildcard harness/*.c))
HARNESS_OBJ := $(HARNESS_SRC:%.c=$(BUILD)/obj/%.o)
ORACLE_SRC  := $(filter-out oracles/llama/tg-llama.c,$(wildcard oracles/llama/*.c))
ORACLE_OBJ  := $(ORACLE_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC    := $(wildcard tests/test_*.c)
TEST_OBJ    := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
TESTS       := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
HELPER_SRC  := $(wildcard tests/helpers/*.c)
HELPER_OBJ  := $(HELPER_SRC:%.c=$(BUILD)/obj/%.o)
HELPERS     := $(HELPER_SRC:tests/helpers/%.c=$(BUILD)/bin/%)
TOOL_SRC    := $(wildcard engine/tools/*.c)
TOOLS       := $(TOOL_SRC:engine/tools/%.c=$(BUILD)/bin/%)
# The programs' own objects (their main()s), outside the libraries.
MAIN_SRC    := $(wildcard engine/worker/main.c harness/main.c oracles/llama/tg-llama.c) $(TOOL_SRC)
MAIN_OBJ    := $(MAIN_SRC:%.c=$(BUILD)/obj/%.o)

LIB_ENGINE  := $(BUILD)/lib/libtg_engine.a
LIB_HARNESS := $(BUILD)/lib/libtg_harness.a
LIB_ORACLE  := $(BUILD)/lib/libtg_oracle.a

BINS := $(TOOLS)
ifneq ($(wildcard engine/worker/main.c),)
  BINS += $(BUILD)/bin/tg-engine
endif
ifneq ($(wildcard oracles/llama/tg-llama.c),)
  BINS += $(BUILD)/bin/tg-llama
endif
ifneq ($(wildcard harness/main.c),)
  BINS += $(BUILD)/bin/tokgate
endif
ifneq ($(wildcard oracles/http/tg-http.c),)
  BINS += $(BUILD)/bin/tg-http
endif

.PHONY: synthetic-gate all deps setup fetch test asan gate bench aarch64 hip gpu gpu-test clean llama-haswell mutants \
        bench-cpu bench-gpu fuzz valgrind fuzz-bins
.DEFAULT_GOAL := all
# Keep objects of pattern chains, so a rebuild compiles only what changed.
.SECONDARY:

# Everything for this machine: libraries, workers, the CLI, tests, helpers.
all: $(BINS) $(TESTS) $(HELPERS) $(BUILD)/mutant-flags

# The flags of this build for tests/helpers/tg-mutate, which compiles one
# mutated engine file like this Makefile would and links a mutant tg-engine
# (the mutation suites: tests/mutants/README.md).
$(BUILD)/mutant-flags: Makefile
	@mkdir -p $(dir $@)
	@printf '%s\n' "root $(TOP)" "cc $(CC)" "ar $(AR)" "cflags $(CPPFLAGS) $(CFLAGS)" \
	  "isa_avx2 $(AVX2_FLAGS)" "isa_avx512 $(AVX512_FLAGS)" \
	  "fp_strict $(FP_STRICT:%=engine/%.c)" "fp_flags $(NO_FP_CONTRACT)" \
	  "ldflags $(LDFLAGS)" "ldlibs $(LDLIBS)" "lib $(TOP)/$(LIB_ENGINE)" \
	  "main $(TOP)/$(BUILD)/obj/engine/worker/main.o" "tg_llama $(TOP)/$(BUILD)/bin/tg-llama" > $@

# Debian packages (only those missing) and the pinned npm packages.
deps:
	bash scripts/setup-deps.sh
	bash scripts/fetch-npm.sh

# The npm packages alone (no root needed).
fetch: $(CACHE)/npm/.fetched
$(CACHE)/npm/.fetched: scripts/fetch-npm.sh
	bash scripts/fetch-npm.sh
	touch $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(FP_FLAGS) $(ISA_FLAGS) -c $< -o $@

# No multiply-add contraction (gcc contracts a * b + c into one fused,
# singly rounded op by default wherever the ISA has FMA: aarch64, or x86-64
# with -mfma) for the engine objects whose bytes are a contract on every
# machine: the ref tier's sums (forward_ref.c), the scalar reference of
# every tensor type and the vector scale search that must write its bytes
# (quant.c, quant_fast.c), and the SIMD kernels whose order of operations
# is written out (engine/cpu/kernels_*.c). This is the one place that sets
# it; each of those files also says so with a pragma.
NO_FP_CONTRACT := -ffp-contract=off
FP_STRICT := forward_ref quant quant_fast cpu/kernels_avx2 cpu/kernels_avx512 cpu/kernels_neon
$(FP_STRICT:%=$(BUILD)/obj/engine/%.o): FP_FLAGS := $(NO_FP_CONTRACT)

# SIMD kernels get their ISA flags; everything else stays portable and the
# engine picks a kernel at run time from what the CPU reports.
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := $(AVX2_FLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni
$(BUILD)/obj/%_avx2.o: ISA_FLAGS := $(AVX2_FLAGS)
$(BUILD)/obj/%_avx512.o: ISA_FLAGS := $(AVX512_FLAGS)

$(LIB_ENGINE): $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIB_HARNESS): $(HARNESS_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The libllama loader (dlopen) shared by tg-llama and the tests that ask
# llama.cpp itself (tokenizer ids, model hyperparameters, logits).
$(LIB_ORACLE): $(ORACLE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/bin/tg-engine: $(BUILD)/obj/engine/worker/main.o $(LIB_ENGINE)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bin/tokgate: $(BUILD)/obj/harness/main.o $(LIB_HARNESS) $(LIB_ENGINE)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bin/%: $(BUILD)/obj/engine/tools/%.o $(LIB_ENGINE)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bin/%: $(BUILD)/obj/tests/helpers/%.o $(LIB_HARNESS) $(LIB_ORACLE) $(LIB_ENGINE)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB_HARNESS) $(LIB_ORACLE) $(LIB_ENGINE)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

# tg-llama: compiled against llama.h of the matching llama.cpp source, links
# nothing of llama.cpp (the library is dlopen'ed at run time). The objects
# that include it wait for the header: on a fresh clone `make all` fetches
# the pinned packages (scripts/fetch-npm.sh, into $(CACHE)), or stops with
# a one-line hint when that cannot be done here.
LLAMA_INC := -I$(LLAMA_CPP_DIR)/include -I$(LLAMA_CPP_DIR)/ggml/include
LLAMA_H   := $(LLAMA_CPP_DIR)/include/llama.h
$(BUILD)/obj/oracles/llama/%.o: CPPFLAGS += $(LLAMA_INC)
$(BUILD)/obj/tests/%.o: CPPFLAGS += $(LLAMA_INC)
$(ORACLE_OBJ) $(BUILD)/obj/oracles/llama/tg-llama.o $(TEST_OBJ) $(HELPER_OBJ): | $(LLAMA_H)
$(LLAMA_H):
	@TOKGATE_CACHE=$(CACHE) bash scripts/fetch-npm.sh >&2 && [ -f $@ ] || \
	 { echo "make: $@ is missing (llama.cpp headers): run \`make deps\` (or set LLAMA_CPP_DIR)" >&2; exit 1; }
$(BUILD)/bin/tg-llama: $(BUILD)/obj/oracles/llama/tg-llama.o $(LIB_ORACLE) $(LIB_ENGINE)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# tg-http: the arm worker over an inference server's HTTP API (libcurl).
$(BUILD)/obj/oracles/http/%.o: CPPFLAGS += $(CURL_CFLAGS)
$(BUILD)/bin/tg-http: $(BUILD)/obj/oracles/http/tg-http.o $(LIB_ENGINE)
	@mkdir -p $(dir $@)
	@[ -n "$(CURL_LIBS)" ] || { echo "tg-http needs libcurl: apt-get install libcurl4-openssl-dev (scripts/setup-deps.sh)" >&2; exit 1; }
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CURL_LIBS)

# Set-up on a fresh machine: Debian packages (only those missing, so this is
# cheap once done) and the pinned npm packages. Skipped with NO_SETUP=1.
setup:
ifneq ($(NO_SETUP),1)
	bash scripts/setup-deps.sh
	bash scripts/fetch-npm.sh
endif

# Unit and integration tests; prints cmocka's summary line of every program.
# tests/test_*.sh are system tests (a real Slurm cluster); the sanitizer
# flavour leaves them out, they test daemons and scripts, not our memory use.
SHELL_TESTS ?= $(wildcard tests/test_*.sh)
test: setup
	$(MAKE) all
	@if [ "$(ARCH)" = x86_64 ] && command -v aarch64-linux-gnu-gcc >/dev/null; then $(MAKE) aarch64; \
	 else echo "make test: no aarch64 cross compiler: the qemu tests will skip"; fi
	@if [ "$(ARCH)" = x86_64 ]; then $(MAKE) llama-haswell; fi
	TG_BUILD=$(TOP)/$(BUILD) TG_ROOT=$(TOP) TG_CACHE=$(CACHE) bash scripts/run-tests.sh $(TESTS) $(SHELL_TESTS)

# The stage replay's mutation suite (tests/mutants/replay/) and its panel of
# legitimate variants alone (also part of make test).
.PHONY: mutants mutants-replay
mutants-replay: all
	TG_BUILD=$(TOP)/$(BUILD) TG_ROOT=$(TOP) TG_CACHE=$(CACHE) $(BUILD)/tests/test_replay

# ASan+UBSan flavour of the unit tests, in its own build folder, then one
# small gate on the shipped model with the sanitized tokgate and workers.
asan:
	$(MAKE) BUILD=build/asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" NO_SETUP=$(NO_SETUP) SHELL_TESTS= test
	bash scripts/small-gate.sh build/asan

# One small gate with tokgate and the engine workers under valgrind (any
# valgrind error makes a process exit 99, which fails its leg or the gate).
VALGRIND ?= valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --quiet
valgrind: all
	SMALL_GATE_STEPS=2 bash scripts/small-gate.sh $(BUILD) $(VALGRIND)

# Fuzzing: each target of tests/fuzz/ as a libFuzzer program (clang, ASan,
# UBSan) over a clang build of the libraries in build/fuzz/, run for
# FUZZ_SECONDS each from the kept corpus (scripts/fuzz.sh). The kept corpus
# is also replayed under gcc by tests/test_fuzz_replay in make test.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := gguf tokenizer spec proto store
FUZZ_SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
fuzz:
	$(MAKE) BUILD=build/fuzz CC=clang OPT=-O1 SAN="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" NO_SETUP=1 fuzz-bins
	bash scripts/fuzz.sh build/fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The parsers live in engine/*.c and harness/*.c; the SIMD kernels
# (engine/cpu/) are left out of the fuzz library.
FUZZ_OBJ := $(filter-out $(ISA_SKIP),$(wildcard engine/*.c)) $(HARNESS_SRC)
FUZZ_OBJ := $(FUZZ_OBJ:%.c=$(BUILD)/obj/%.o)
$(BUILD)/lib/libtg_fuzz.a: $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
fuzz-bins: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(BUILD)/lib/libtg_fuzz.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -DTG_LIBFUZZER -fsanitize=fuzzer -o $@ $< $(BUILD)/lib/libtg_fuzz.a $(LDLIBS)

# The default gate on the model the project ships (the aarch64 oracle needs
# the cross-built worker, the llama-haswell variant its library folder).
gate: setup
	$(MAKE) all
	$(MAKE) aarch64
	$(MAKE) llama-haswell
	$(BUILD)/bin/tokgate gate specs/default.yaml --evidence $(BUILD)/evidence

# llama.cpp limited to its haswell CPU backend (a calibration panel variant
# of specs/default.yaml): a folder holding libllama and only that backend,
# since tg-llama loads every backend of its library's folder and ggml picks
# the best one. Copies, not links (the loader resolves links to the cache).
LLAMA_X64 := $(CACHE)/npm/linux-x64/bins/linux-x64
llama-haswell: build/llama-haswell/libllama.so
build/llama-haswell/libllama.so: | $(CACHE)/npm/.fetched
	@mkdir -p $(dir $@)
	cp $(LLAMA_X64)/libllama.v0.4.0.so $(LLAMA_X64)/libggml.v0.4.0.so $(LLAMA_X64)/libggml-base.so \
	  $(LLAMA_X64)/libggml-cpu-haswell.so $(dir $@)
	ln -sf libllama.v0.4.0.so $@

# The whole token-gate mutation suite (tests/mutants/): every mutant tg-engine against
# the calibration of specs/mutants.yaml; `make test` runs a subset. With
# MUTANT_SPEC=specs/default.yaml each mutant runs the default gate itself.
mutants: all llama-haswell
	TG_BUILD=$(TOP)/$(BUILD) TG_ROOT=$(TOP) TG_CACHE=$(CACHE) TG_MUTANTS=all TG_MUTANT_SPEC=$(MUTANT_SPEC) \
	  $(BUILD)/tests/test_calibrate

# The synthetic spec's model: tg-mkmodel tiny Q4_K_M, seed 1, real Qwen3
# tokenizer (same seed, same bytes: specs/synthetic-qwen3.yaml pins them).
SYNTH_MODEL := build/models/tiny-qwen3-Q4_K_M-s1.gguf
$(SYNTH_MODEL): $(BUILD)/bin/tg-mkmodel
	@mkdir -p $(dir $@)
	$(BUILD)/bin/tg-mkmodel --preset tiny --type q4_k_m --seed 1 -o $@

synthetic-gate: setup
	$(MAKE) all
	$(MAKE) $(SYNTH_MODEL)
	$(BUILD)/bin/tokgate gate specs/synthetic-qwen3.yaml

# Benchmarks: figures as ratios against llama.cpp measured in the same run.
bench: all fetch
	bash scripts/bench.sh $(BUILD)

# The cpu tier against llama.cpp (same file, threads and run): decode and
# prefill tokens/s as ratios, and resident memory (scripts/bench-cpu.sh).
bench-cpu: $(BUILD)/bin/tg-engine $(BUILD)/bin/tg-llama $(BUILD)/bin/tg-mkmodel fetch
	bash scripts/bench-cpu.sh $(BUILD)

# Cross build of the arm workers for aarch64 (run under qemu-aarch64).
aarch64:
	$(MAKE) BUILD=build/aarch64 ARCH=aarch64 CC=aarch64-linux-gnu-gcc SAN= OPT=-O2 \
	  PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig \
	  PKGS="libzstd libpcre2-8 jansson libcrypto libxxhash" \
	  build/aarch64/bin/tg-engine build/aarch64/bin/tg-llama

# GPU sources compiled by hipcc for AMD (compile and link only, no GPU needed).
hip:
	@if [ -f engine/gpu/gpu.mk ]; then $(MAKE) -f engine/gpu/gpu.mk hip BUILD=$(BUILD); \
	 else echo "make hip: the GPU arm (engine/gpu/) is not written yet" >&2; exit 1; fi

# GPU arm built by nvcc for sm_90.
gpu:
	@if [ -f engine/gpu/gpu.mk ]; then $(MAKE) -f engine/gpu/gpu.mk gpu BUILD=$(BUILD); \
	 else echo "make gpu: the GPU arm (engine/gpu/) is not written yet" >&2; exit 1; fi

gpu-test:
	@if [ -f engine/gpu/gpu.mk ]; then $(MAKE) -f engine/gpu/gpu.mk gpu-test BUILD=$(BUILD); \
	 else echo "make gpu-test: the GPU arm (engine/gpu/) is not written yet" >&2; exit 1; fi

# GPU arm decode/prefill tokens/s and roofline fraction (beside llama.cpp CUDA
# when LLAMA_BENCH and TG_GPU_BENCH_MODEL are set); needs a GPU.
bench-gpu:
	@if [ -f engine/gpu/gpu.mk ]; then $(MAKE) -f engine/gpu/gpu.mk bench-gpu BUILD=$(BUILD); \
	 else echo "make bench-gpu: the GPU arm (engine/gpu/) is not written yet" >&2; exit 1; fi

clean:
	rm -rf build

# The header dependencies gcc wrote (-MMD) for every object this Makefile
# compiles: libraries, programs, tests and helpers.
-include $(ENGINE_OBJ:.o=.d) $(HARNESS_OBJ:.o=.d) $(ORACLE_OBJ:.o=.d) $(MAIN_OBJ:.o=.d) \
         $(TEST_OBJ:.o=.d) $(HELPER_OBJ:.o=.d) \
         $(BUILD)/obj/oracles/http/tg-http.d
