/*
 * composer/composer.h — everything public in Composer for C.
 *
 * Layers (each header documents its own part): base.h (status, logging, memory, threads, RNG,
 * hashing, clocks) and tensor.h (tensors, autograd tape, ops).
 */
#ifndef COMPOSER_COMPOSER_H
#define COMPOSER_COMPOSER_H

#include <composer/base.h>
#include <composer/tensor.h>

#endif
