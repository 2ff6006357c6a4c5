// flexpar/checkpoint/checkpoint.hpp — distributed checkpoints of global tensors: the umbrella header.
//
//   state.hpp  state: named global tensors, host tensors (replicated, per rank) and integers
//   save.hpp   save(): one data file per rank and metadata.json, committed atomically;
//              async_saver: the same in the background after a snapshot
//   load.hpp   load(): onto any ranks, placements and SBPs, reading only the regions each rank
//              needs; read_contents(): what a checkpoint holds
//
// The file format, the atomicity argument and the measured bandwidth: doc/checkpoint.md.
#pragma once

#include <flexpar/checkpoint/load.hpp>
#include <flexpar/checkpoint/save.hpp>
#include <flexpar/checkpoint/state.hpp>
