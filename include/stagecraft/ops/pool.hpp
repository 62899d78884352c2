// nn::max_pool2d and nn::avg_pool2d (NCHW).
#pragma once
