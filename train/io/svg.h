// train/io/svg.h — loss.svg: train and val curves as a dependency-free SVG line chart,
// redrawn at every eval so a browser shows the run as it goes.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ffn::train {

struct Curve {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;  // (iter, loss)
};

// Writes an SVG line chart of the curves (iterations on x, loss on y) atomically.
void write_loss_svg(const std::string& path, const std::vector<Curve>& curves,
                    const std::string& title);

}  // namespace ffn::train
