# llama3.cu build. `make train_llama3`, `make test_llama3`, `make dev`, `make test`.
# Builds machine code for H100/H200 (sm_90a) and A100 and its family (sm_80), and compute_80 PTX that
# the driver compiles at start for newer GPUs; GENCODE=... overrides.
# NVTX=0 compiles the NVTX ranges out.

NVCC ?= nvcc
CC ?= gcc
GENCODE ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=[sm_80,compute_80]
NVTX ?= 1
# NVTX=0 also turns off the ranges CUB (the token sort) adds on its own.
NVTX_OFF = $(if $(filter 0,$(NVTX)),-DNVTX_DISABLE -DCCCL_DISABLE_NVTX,)
NVCC_FLAGS = -O3 -std=c++17 $(GENCODE) -DLLAMA3_NVTX=$(NVTX) $(NVTX_OFF) -Xcompiler -Wall -Xcompiler -Wno-unused-function
LIBS = -lcublasLt
CFLAGS = -std=gnu11 -O2 -Wall -Wextra

# NCCL, for training on several GPUs (dev/nccl, and the trainer's data-parallel step): NCCL_HOME if given (its include/ and lib/libnccl.so.2), else the CUDA toolkit's,
# else PyTorch's nvidia-nccl wheel. Without one dev/nccl is left out (make test lists it as skipped).
CUDA_ROOT := $(abspath $(dir $(shell command -v $(NVCC) 2>/dev/null))..)
NCCL_HOME ?= $(firstword $(if $(wildcard $(CUDA_ROOT)/include/nccl.h),$(CUDA_ROOT)) \
               $(shell python3 -c "import nvidia.nccl as n; print(n.__path__[0])" 2>/dev/null))
NCCL_LIB := $(firstword $(wildcard $(NCCL_HOME)/lib/libnccl.so.2 $(NCCL_HOME)/lib64/libnccl.so.2))
NCCL_INCLUDE = -DLLAMA3_NCCL=1 -I$(NCCL_HOME)/include
NCCL_FLAGS = $(NCCL_INCLUDE) -L$(dir $(NCCL_LIB)) -l:libnccl.so.2 -Xlinker -rpath=$(dir $(NCCL_LIB))

DEV_SOURCES = $(filter-out $(if $(NCCL_LIB),,dev/nccl.cu),$(wildcard dev/*.cu))
DEV_BINARIES = $(DEV_SOURCES:.cu=)

.PHONY: all dev test sanitize clean bench-kernels test-recipes compile-check
all: train_llama3 test_llama3 test_llama3_host dev

# BUILD_LOG=FILE (make test sets it): each build command's output goes to FILE, and one line per
# target to the screen (scripts/build_step.sh). Unset, the commands print as usual.
BUILD_LOG ?=
STEP = $(if $(BUILD_LOG),@bash scripts/build_step.sh $(BUILD_LOG) $@ ,)

# The default data set is linked into the trainer as binary blobs (symbols
# _binary_data_tiny_shakespeare_train_bin_start/_end, and _val_ for the val split), so
# ./train_llama3 needs no files.
build/default_data.o: data/tiny_shakespeare_train.bin
	@mkdir -p build
	$(STEP)ld -r -b binary -z noexecstack -o $@ $<
build/default_val.o: data/tiny_shakespeare_val.bin
	@mkdir -p build
	$(STEP)ld -r -b binary -z noexecstack -o $@ $<
# The LLaMA-3 id-to-bytes table (scripts/prepare_data.py), for printing generated tokens as text:
# _binary_data_llama3_vocab_bin_start/_end.
build/vocab.o: data/llama3_vocab.bin
	@mkdir -p build
	$(STEP)ld -r -b binary -z noexecstack -o $@ $<

BLOBS = build/default_data.o build/default_val.o build/vocab.o
# $(call build,TARGETS,LOG): TARGETS built JOBS at once (the CPU cores), a line per target and the
# compiler's lines in LOG (scripts/build_step.sh). The blobs come first, alone: with them there, make -j
# starts the trainer, the longest compile, at once (else after every other target).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
build = $(MAKE) --no-print-directory -s $(BLOBS) BUILD_LOG=$(2) && $(MAKE) --no-print-directory -s -j$(JOBS) $(1) BUILD_LOG=$(2)
# The trainer's data-parallel step (several ranks through NCCL, ZeRO-1) is built when NCCL is found
# (DATA_PARALLEL=1; DATA_PARALLEL=0 leaves it out, and a DATA_PARALLEL=1 without NCCL is an error).
# Without it the trainer trains one rank, and says so to a launch of several.
DATA_PARALLEL ?= $(if $(NCCL_LIB),1,0)
TRAIN_NCCL = $(if $(filter 1,$(DATA_PARALLEL)),$(if $(NCCL_LIB),$(NCCL_FLAGS),$(error DATA_PARALLEL=1: no NCCL found (NCCL_HOME, the CUDA toolkit, PyTorch's wheel))))
ONE_GPU_NOTE = @$(if $(TRAIN_NCCL),:,echo "$@: built without NCCL ($(if $(NCCL_LIB),DATA_PARALLEL=0,none found in NCCL_HOME, the CUDA toolkit or PyTorch's wheel)): one GPU, one rank")
train_llama3: train_llama3.cu kernels.cuh llama3.h $(BLOBS)
	$(STEP)$(NVCC) $(NVCC_FLAGS) $(TRAIN_NCCL) train_llama3.cu $(BLOBS) $(LIBS) -o $@
	$(ONE_GPU_NOTE)

test_llama3: test_llama3.cu train_llama3.cu kernels.cuh llama3.h
	$(STEP)$(NVCC) $(NVCC_FLAGS) $(TRAIN_NCCL) test_llama3.cu $(LIBS) -o $@
	$(ONE_GPU_NOTE)

# The host tests run under AddressSanitizer and UndefinedBehaviorSanitizer: a hostile file must end
# in an error message, never in a sanitizer report (-fno-sanitize-recover: a report fails the run).
SANITIZE = -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -g
test_llama3_host: test_llama3_host.c llama3.h
	$(STEP)$(CC) $(CFLAGS) $(SANITIZE) test_llama3_host.c -lm -o $@

dev: $(DEV_BINARIES)
dev/%: dev/%.cu dev/common.h kernels.cuh llama3.h
	$(STEP)$(NVCC) $(NVCC_FLAGS) $< $(LIBS) -o $@
dev/nccl: dev/nccl.cu dev/common.h kernels.cuh llama3.h
	$(STEP)$(NVCC) $(NVCC_FLAGS) $(NCCL_FLAGS) $< $(LIBS) -o $@

# compile-check: test_llama3 and every dev/ benchmark through nvcc's front end, whose C++ analysis covers
# the file's host and device code, to PTX for sm_90a at cicc -O0 (build/check/*.ptx): no ptxas, host
# compiler or link, about 5 s a file instead of 45. What make test does with them on a machine without a
# GPU, where nothing runs them; dev/TESTING.md says what it leaves to the full build.
CHECK_FLAGS = -std=c++17 -ptx -arch=compute_90a -Xcicc -O0 -DLLAMA3_NVTX=$(NVTX) $(NVTX_OFF)
COMPILE_CHECKS = build/check/test_llama3.ptx $(DEV_SOURCES:dev/%.cu=build/check/dev_%.ptx)
compile-check: $(COMPILE_CHECKS)
build/check/test_llama3.ptx: test_llama3.cu train_llama3.cu kernels.cuh llama3.h
	@mkdir -p build/check
	$(STEP)$(NVCC) $(CHECK_FLAGS) $(if $(TRAIN_NCCL),$(NCCL_INCLUDE)) $< -o $@
build/check/dev_%.ptx: dev/%.cu dev/common.h kernels.cuh llama3.h
	@mkdir -p build/check
	$(STEP)$(NVCC) $(CHECK_FLAGS) $(if $(filter dev/nccl.cu,$<),$(NCCL_INCLUDE)) $< -o $@

# Builds, installs the scripts' missing Python packages, runs the host tests, and on a GPU machine the
# reference comparison and the dev/ kernel checks. On a machine without a GPU it builds what runs there
# (the trainer, the host tests) and only compile-checks test_llama3 and dev/ (their tests are GPU parts).
# The screen gets a line for the build, a line per part, the skipped parts and "N passed, M failed, K
# skipped"; everything else goes to build/make_test.log (each target's time, every check's line) and
# build/make_test_build.log (the compiler's lines).
TEST_BUILD_LOG = build/make_test_build.log
TEST_LOG = build/make_test.log
NO_GPU_BUILD = train_llama3 test_llama3_host compile-check
TEST_BUILD = $(if $(shell nvidia-smi -L 2>/dev/null),all,$(NO_GPU_BUILD))
test:
	@mkdir -p build && : > $(TEST_BUILD_LOG) && : > $(TEST_LOG)
	@echo "build: make $(TEST_BUILD), $(JOBS) at once$(if $(filter all,$(TEST_BUILD)),,; no GPU here: test_llama3 and dev/ compile-checked, as nothing here runs them)" | tee -a $(TEST_LOG)
	@t0=$$(date +%s); \
	{ $(call build,$(TEST_BUILD),$(TEST_BUILD_LOG)); } >> $(TEST_LOG) 2>&1 || \
		{ grep -A 20 '^FAILED' $(TEST_LOG) || tail -n 5 $(TEST_LOG); echo "the build failed: the compiler's lines are in $(TEST_BUILD_LOG)"; exit 1; }; \
	secs=$$(($$(date +%s) - t0)); \
	echo "-- build: $$(grep -c '^build ' $(TEST_LOG)) targets, $$secs s" | tee -a $(TEST_LOG); \
	LLAMA3_TEST_LOG=$(TEST_LOG) LLAMA3_BUILD_SECONDS=$$secs bash scripts/run_tests.sh

# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over small-shape training runs and every
# dev/ kernel check; error counts per tool, ours apart from NVIDIA's libraries (needs a GPU). Its build:
# a line per target, the compiler's lines in build/make_sanitize_build.log.
sanitize:
	@mkdir -p build && $(call build,train_llama3 dev,build/make_sanitize_build.log)
	bash scripts/sanitize.sh

# The README's recipes run as written (needs a GPU; minutes, and ~40 GB of disk for the 1B's checkpoints).
test-recipes: train_llama3
	bash scripts/test_recipes.sh

# Every dev/ microbenchmark, validated then timed, and one table of all rows (needs a GPU).
bench-kernels:
	@mkdir -p build && $(call build,dev,build/make_bench_build.log)
	bash scripts/bench_kernels.sh

clean:
	rm -rf build train_llama3 test_llama3 test_llama3_host $(DEV_BINARIES)
