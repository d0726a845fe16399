/*
 * composer/composer.h — everything public in Composer for C.
 *
 * Layers (each header documents its own part): base.h (status, logging, memory, threads, RNG,
 * hashing, clocks), tensor.h (tensors, autograd tape, ops), data.h (datasets, samplers, the
 * dataloader, the data spec), datasets.h (token files, MNIST, CIFAR-10, image augmentation), tokenizer.h (GPT-2 BPE,
 * BERT WordPiece, characters; token-file writer; the SST-2 dataset), safetensors.h (reader,
 * writer, sharded index), time.h (Composer's Time strings and Timestamp), optim.h (optimizers over
 * flat buffers, schedulers as pure functions of time), nn.h (modules, flat parameter buffers,
 * surgery, layers), model.h (the ComposerModel-style model interface and metrics), zoo_*.h (the
 * model zoo), report.h (progress bar, JSON Lines metrics file, SVG plots, run folders),
 * data_algos.h (Composer's data methods: MixUp, CutMix, CutOut, LabelSmoothing, ...),
 * train_algos.h (the training methods EMA, SWA, SAM and LayerFreezing).
 */
#ifndef COMPOSER_COMPOSER_H
#define COMPOSER_COMPOSER_H

#include <composer/base.h>
#include <composer/tensor.h>
#include <composer/data.h>
#include <composer/datasets.h>
#include <composer/tokenizer.h>
#include <composer/safetensors.h>
#include <composer/time.h>
#include <composer/optim.h>
#include <composer/nn.h>
#include <composer/model.h>
#include <composer/zoo_bert.h>
#include <composer/zoo_gpt2.h>
#include <composer/zoo_vision.h>
#include <composer/report.h>
#include <composer/trainer.h>
#include <composer/algorithms.h>
#include <composer/surgery_algorithms.h>
#include <composer/data_algos.h>
#include <composer/train_algos.h>
#include <composer/callbacks.h>
#include <composer/profiler.h>
#include <composer/loggers.h>
#include <composer/config.h>
#include <composer/dist.h>
#include <composer/storage.h>
#include <composer/checkpoint.h>
#include <composer/hf.h>
#include <composer/time_to_target.h>

#endif
