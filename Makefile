# flexc: the two commands of the README, and the rest of the build.
#   make run            install what is missing, build, run the main job on the default data
#   make test           install what is missing, build, run every test (CTest)
#   make                build into build/
#   make install PREFIX=/usr/local
#   make test-sanitize  the test suite under ASan + UBSan (build-asan/)
#   make test-noomp     build and test without OpenMP (build-noomp/)
#   make fuzz           build the libFuzzer targets and run each for FUZZ_SECONDS
#   make build-gpu      the build scripts/gpu-check.sh carries to a GPU machine (build-gpu/)

BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 60

.PHONY: all deps build run test test-sanitize test-noomp fuzz install clean build-gpu

all: build

deps:
	@scripts/deps.sh

build:
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

run: deps build
	@scripts/run.sh $(BUILD)

test: deps build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-sanitize: deps
	@$(MAKE) --no-print-directory test BUILD=build-asan CMAKE_FLAGS="-DFLEXC_SANITIZE=ON -DFLEXC_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo"

test-noomp: deps
	@$(MAKE) --no-print-directory test BUILD=build-noomp CMAKE_FLAGS="-DFLEXC_OPENMP=OFF -DFLEXC_CUDA=OFF"

fuzz: deps
	@scripts/deps.sh ci
	@test -f build-fuzz/CMakeCache.txt || CC=clang cmake -S . -B build-fuzz -DFLEXC_FUZZ=ON -DFLEXC_OPENMP=OFF -DFLEXC_MPI=OFF -DFLEXC_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

GPU_TESTS = $(notdir $(basename $(wildcard tests/test_cuda_gpu_*.c)))

build-gpu:
	@test -f build-gpu/CMakeCache.txt || cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFLEXC_CUDA=ON -DFLEXC_MPI=OFF -DFLEXC_GPU_PORTABLE=ON >/dev/null
	@cmake --build build-gpu -j $(JOBS) --target bench_cuda flexc_portable test_gemm_bf16_portable bench_gemm_bf16_portable $(GPU_TESTS)
	@echo "$$(git rev-parse --short HEAD)$$(git diff --quiet HEAD -- src include cmake CMakeLists.txt || echo +changes)" > build-gpu/commit
	@# Stripped, and one xz stream with a dictionary larger than a program: the programs share
	@# most of their bytes (the library and its kernels), so the bundle is a few MB, not 200.
	@rm -rf build-gpu/bundle && mkdir build-gpu/bundle
	@cd build-gpu && cp commit bench_cuda test_gemm_bf16_portable bench_gemm_bf16_portable $(GPU_TESTS) bundle/ && cp flexc_portable bundle/flexc
	@strip --strip-unneeded $(addprefix build-gpu/bundle/,bench_cuda flexc test_gemm_bf16_portable bench_gemm_bf16_portable $(GPU_TESTS))
	@cd build-gpu/bundle && tar -cf - * | xz -9 -T$(JOBS) > ../gpu-bundle.tar.xz
	@echo "build-gpu/gpu-bundle.tar.xz: $$(du -h build-gpu/gpu-bundle.tar.xz | cut -f1) (carry it with the repository; scripts/gpu-check.sh unpacks it)"

install: build
	@cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)
	@cmake --install $(BUILD)

clean:
	rm -rf build build-asan build-noomp build-fuzz build-gpu
