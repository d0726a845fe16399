# Thin wrapper over CMake so the README's commands are one word each.
#   make            install missing Debian packages (as root), configure and build
#   make demo       build, tokenize tiny Shakespeare (once), train examples/shakespeare-char.yaml with
#                   `composer train`, and show where the log, the loss plot and the text sample are
#   make test       build and run the whole test suite (CTest; its summary is the last line)
#   make test-asan  the same suite built with AddressSanitizer + UndefinedBehaviorSanitizer
#   make bench      build the benchmarks and run bench/gemm
#   make bench-train  training throughput, peak RSS and MFU against PyTorch (bench/train_throughput.c)
#   make fuzz       run every libFuzzer target for FUZZ_TIME seconds (default 60)
#   make golden     regenerate tests/golden/*.safetensors with Debian's PyTorch
#   make install    install the library, headers and pkg-config file (PREFIX=/usr/local)

BUILD   ?= build
MAKEFLAGS += --no-print-directory
ASAN    ?= build-asan
PREFIX  ?= /usr/local
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-asan bench bench-train fuzz golden install clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/CMakeCache.txt: | deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS) >/dev/null

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	@cmake --build $(BUILD) -j $(JOBS)

DATA ?= ../shared/data

DEMO_DATA ?= data/shakespeare_char
DEMO_RUN  ?= runs/shakespeare-char

demo: build
	@test -f $(DEMO_DATA)/train.bin -a -f $(DEMO_DATA)/val.bin -a -f $(DEMO_DATA)/tokenizer.json || \
	  $(BUILD)/tools/composer data tokenize --tokenizer char $(DATA)/tinyshakespeare/input.txt -o $(DEMO_DATA)
	@$(BUILD)/tools/composer train examples/shakespeare-char.yaml run_root=$(patsubst %/,%,$(dir $(DEMO_RUN))) \
	  run_name=$(notdir $(DEMO_RUN)) train_loader.dataset.dir=$(DEMO_DATA) eval_loader.dataset.dir=$(DEMO_DATA)
	@echo
	@echo "log:     $(DEMO_RUN)/log.txt (metrics: $(DEMO_RUN)/metrics.jsonl)"
	@echo "plot:    $(DEMO_RUN)/loss.svg"
	@echo "sample:  $(DEMO_RUN)/sample.txt"
	@echo "more:    $(BUILD)/tools/composer generate --weights $(DEMO_RUN)/model.safetensors --prompt 'ROMEO:'"

test: build
	@scripts/run-tests $(BUILD) -j $(JOBS)

$(ASAN)/CMakeCache.txt: | deps
	@cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=Debug -DCM_SANITIZE=ON -DCM_BUILD_BENCH=OFF >/dev/null

test-asan: deps $(ASAN)/CMakeCache.txt
	@cmake --build $(ASAN) -j $(JOBS)
	@scripts/run-tests $(ASAN) -j $(JOBS)

bench: build
	@$(BUILD)/bench/bench_gemm

bench-train: build
	@$(BUILD)/bench/bench_train_throughput

FUZZ_TIME ?= 60

fuzz: build
	@scripts/run-fuzz $(BUILD) $(FUZZ_TIME)

golden:
	@scripts/install-deps --golden
	@/usr/bin/python3 tests/golden/make_golden.py

install: build
	@cmake --install $(BUILD)

clean:
	@rm -rf $(BUILD) $(ASAN)
