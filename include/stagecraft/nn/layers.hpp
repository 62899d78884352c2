// All layers: nn::Dense, nn::Conv2D, nn::LSTMCell, nn::GRUCell, nn::MultiHeadAttention,
// nn::TransformerEncoderLayer, nn::Embedding, nn::LayerNorm, nn::BatchNorm, nn::Dropout (each a
// sc::Module, called as layer(x)).
#pragma once
#include "attention.hpp"
#include "batch_norm.hpp"
#include "conv.hpp"
#include "dense.hpp"
#include "dropout.hpp"
#include "embedding.hpp"
#include "gru.hpp"
#include "init.hpp"
#include "lstm.hpp"
#include "normalization.hpp"
#include "transformer.hpp"
