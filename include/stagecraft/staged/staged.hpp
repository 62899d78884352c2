// Compile-time staging: sc::staged<E>, sc::stage, sc::eval, sc::compile, sc::grad<I>.
// The graph is a C++ type (staged/expr.hpp), evaluated as one fused loop (staged/eval.hpp).
#pragma once
#include "api.hpp"
#include "compile.hpp"
#include "expr.hpp"
#include "grad.hpp"
