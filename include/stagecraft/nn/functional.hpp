// nn::softmax, log_softmax, cross_entropy: composites of other ops.
#pragma once
