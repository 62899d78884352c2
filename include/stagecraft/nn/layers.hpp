// All layers: nn::Dense, nn::Conv2D, nn::LSTMCell (each a sc::Module, called as layer(x)).
#pragma once
#include "conv.hpp"
#include "dense.hpp"
#include "init.hpp"
#include "lstm.hpp"
