// flexpar/relax.hpp — every communication relaxation (BAGUA) and its optimizers, in one include.
//
// For command lines, flexpar/relax/registry.hpp alone is lighter: relax::make(name, comm, options).
// doc/relaxations.md describes each algorithm's pattern, bytes on the wire and when to use it.
#pragma once

#include <flexpar/relax/async_model_average.hpp>
#include <flexpar/relax/bytegrad.hpp>
#include <flexpar/relax/decentralized.hpp>
#include <flexpar/relax/gradient_allreduce.hpp>
#include <flexpar/relax/local_sgd.hpp>
#include <flexpar/relax/low_precision_decentralized.hpp>
#include <flexpar/relax/onebit_adam.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/qadam.hpp>
#include <flexpar/relax/registry.hpp>
#include <flexpar/relax/relaxation.hpp>
