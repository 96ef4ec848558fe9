# engine/gpu/gpu.mk: the GPU arm's builds. The top Makefile delegates
# `make gpu`, `make hip`, `make gpu-test` and `make bench-gpu` here
# (make -f engine/gpu/gpu.mk TARGET BUILD=...); run from the repository root.
#
# One CUDA-spelled source tree, two compilers:
#   gpu        nvcc for NVIDIA (sm_90, the H200 the arm is measured on):
#              libtg_gpu.a, tg-engine with --tier gpu, the GPU tests and the
#              benchmark, under $(BUILD)/gpu/.
#   hip        hipcc for AMD (gfx1030 and gfx90a) through vendor_hip.h:
#              compile and link only (CI has no GPU), under $(BUILD)/hip/,
#              so the ROCm build cannot rot.
#   gpu-test   builds with nvcc and runs the kernel-level differential tests
#              and the model-level test (scripts/gpu-test.sh; GPU_TEST_ARGS:
#              model files for test_gpu_model); on a machine without a GPU
#              (or without nvcc) they say SKIP and succeed.
#   bench-gpu  decode and prefill tokens/s of the gpu tier (scripts/gpu-bench.sh;
#              GPU_BENCH_ARGS: its options, e.g. --model FILE --llama-cuda-lib LIB).
#
# The host side of the engine (sessions, the ref and cpu tiers, loader,
# quant, util) comes from the top Makefile's libtg_engine.a in the same
# BUILD folder. The GPU objects are linked as objects, not through the
# archive: the engine names the gpu tier's table (tg_tier_gpu) only as a
# weak symbol, which would not pull it out of an archive; linked, it
# registers the tier (engine/tier.h).

BUILD    ?= build
TOP      := $(CURDIR)
CACHE    ?= $(TOP)/.cache
CUDA_HOME ?= $(firstword $(wildcard /usr/local/cuda) /usr)
NVCC     ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) nvcc)
HIPCC    ?= hipcc
CUDA_ARCH ?= -gencode=arch=compute_90,code=sm_90
HIP_ARCH ?= --offload-arch=gfx1030 --offload-arch=gfx90a
CC       ?= gcc
CXX      ?= g++
# Extra include/library folders (e.g. -dev packages unpacked on a machine
# where they are not installed): DEPS_PREFIX=/path/usr
DEPS_PREFIX ?=

PKGS       := sqlite3 libzstd libpcre2-8 jansson libfyaml libcrypto libxxhash
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ifeq ($(PKG_LIBS),)
  PKG_LIBS := -lsqlite3 -lzstd -lpcre2-8 -ljansson -lfyaml -lcrypto -lxxhash
endif
ifneq ($(DEPS_PREFIX),)
  DEP_INC := -I$(DEPS_PREFIX)/include -I$(DEPS_PREFIX)/include/x86_64-linux-gnu
  DEP_LIB := -L$(DEPS_PREFIX)/lib/x86_64-linux-gnu -Wl,-rpath,$(DEPS_PREFIX)/lib/x86_64-linux-gnu
endif

GPU_SRC  := engine/gpu/kernels.cu engine/gpu/gpu.cu
GPU_HDR  := $(wildcard engine/gpu/*.h engine/gpu/*.cuh) engine/util.h engine/quant.h engine/model.h engine/ops.h \
            engine/tier.h
GB       := $(BUILD)/gpu
HB       := $(BUILD)/hip
LIB_ENGINE := $(BUILD)/lib/libtg_engine.a

NVCC_FLAGS := -std=c++17 -O3 $(CUDA_ARCH) -lineinfo -I$(TOP)/engine $(DEP_INC) \
              -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -Xptxas -warn-spills
HIP_FLAGS  := -std=c++17 -O3 -DTG_GPU_HIP $(HIP_ARCH) -I$(TOP)/engine $(DEP_INC) \
              -Wall -Wextra -Wno-unused-parameter -Wno-unused-result
HOST_CFLAGS := -std=gnu11 -O2 -g -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter \
               -Wno-missing-field-initializers -I$(TOP)/engine $(DEP_INC)
# the CUDA runtime linked statically: the binaries then need only the driver
# (libcuda.so) on the machine that runs them, whatever toolkit it has
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -lcudart_static -lrt -ldl
HIP_LIBS   := -lamdhip64
HOST_LIBS  := $(DEP_LIB) $(PKG_LIBS) -ldl -lm -lpthread -lstdc++

TEST_C   := $(wildcard tests/gpu/*.c)
TEST_CU  := $(wildcard tests/gpu/*.cu)

.PHONY: gpu hip gpu-test bench-gpu engine-lib
.SECONDARY:
.DEFAULT_GOAL := gpu

# The host engine library, built by the top Makefile into the same BUILD.
engine-lib:
	$(MAKE) -f Makefile BUILD=$(BUILD) NO_SETUP=1 $(LIB_ENGINE)

# ---- nvcc ------------------------------------------------------------------

$(GB)/obj/%.o: %.cu $(GPU_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(GB)/obj/%.o: %.c $(GPU_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(HOST_CFLAGS) -c $< -o $@

GPU_OBJ := $(GPU_SRC:%.cu=$(GB)/obj/%.o)
$(GB)/lib/libtg_gpu.a: $(GPU_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

GPU_BINS := $(TEST_CU:tests/gpu/%.cu=$(GB)/tests/%) $(TEST_C:tests/gpu/%.c=$(GB)/tests/%)
ifneq ($(wildcard engine/worker/main.c),)
  GPU_BINS += $(GB)/bin/tg-engine
endif

$(GB)/tests/%: $(GB)/obj/tests/gpu/%.o $(GPU_OBJ) $(GB)/lib/libtg_gpu.a engine-lib
	@mkdir -p $(dir $@)
	$(CXX) -o $@ $< $(GPU_OBJ) $(LIB_ENGINE) $(CUDA_LIBS) $(HOST_LIBS)

$(GB)/bin/tg-engine: $(GB)/obj/engine/worker/main.o $(GPU_OBJ) $(GB)/lib/libtg_gpu.a engine-lib
	@mkdir -p $(dir $@)
	$(CXX) -o $@ $< $(GPU_OBJ) $(LIB_ENGINE) $(CUDA_LIBS) $(HOST_LIBS)

gpu: engine-lib $(GPU_BINS)

# ---- hipcc (compile and link only) -------------------------------------------

$(HB)/obj/%.o: %.cu $(GPU_HDR)
	@mkdir -p $(dir $@)
	$(HIPCC) $(HIP_FLAGS) -x hip -c $< -o $@

$(HB)/obj/%.o: %.c $(GPU_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(HOST_CFLAGS) -c $< -o $@

HIP_OBJ := $(GPU_SRC:%.cu=$(HB)/obj/%.o)
$(HB)/lib/libtg_gpu.a: $(HIP_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

HIP_BINS := $(TEST_CU:tests/gpu/%.cu=$(HB)/tests/%) $(TEST_C:tests/gpu/%.c=$(HB)/tests/%)
ifneq ($(wildcard engine/worker/main.c),)
  HIP_BINS += $(HB)/bin/tg-engine
endif

$(HB)/tests/%: $(HB)/obj/tests/gpu/%.o $(HIP_OBJ) $(HB)/lib/libtg_gpu.a engine-lib
	@mkdir -p $(dir $@)
	$(HIPCC) $(HIP_ARCH) -o $@ $< $(HIP_OBJ) $(LIB_ENGINE) $(HIP_LIBS) $(HOST_LIBS)

$(HB)/bin/tg-engine: $(HB)/obj/engine/worker/main.o $(HIP_OBJ) $(HB)/lib/libtg_gpu.a engine-lib
	@mkdir -p $(dir $@)
	$(HIPCC) $(HIP_ARCH) -o $@ $< $(HIP_OBJ) $(LIB_ENGINE) $(HIP_LIBS) $(HOST_LIBS)

hip: engine-lib $(HIP_BINS)
	@echo "make hip: compiled and linked for gfx1030 and gfx90a: $(HIP_BINS)"

# ---- tests and benchmark -----------------------------------------------------

GPU_TEST_ARGS  ?=
GPU_BENCH_ARGS ?=

gpu-test:
	@if [ ! -x "$(NVCC)" ] && ! command -v $(NVCC) >/dev/null 2>&1; then \
	   echo "SKIP: gpu-test: no nvcc (CUDA) on this machine"; exit 0; fi; \
	 $(MAKE) -f engine/gpu/gpu.mk BUILD=$(BUILD) gpu && \
	 TG_ROOT=$(TOP) TG_BUILD=$(TOP)/$(BUILD) TG_CACHE=$(CACHE) bash scripts/gpu-test.sh $(GB)/tests $(GPU_TEST_ARGS)

bench-gpu: gpu
	TG_ROOT=$(TOP) TG_BUILD=$(TOP)/$(BUILD) TG_CACHE=$(CACHE) bash scripts/gpu-bench.sh $(GB) $(GPU_BENCH_ARGS)
