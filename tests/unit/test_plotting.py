"""course_lib.plotting's accuracy plots: what the axes show."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from course_lib.plotting import accuracy_vs_length, per_position_accuracy


def test_per_position_accuracy_plots_one_curve_per_label_on_positions_from_1():
    ax = per_position_accuracy({"RNN": torch.tensor([0.9, 0.5, 0.2]), "attention": [1.0, 0.95, 0.9]})
    try:
        assert [line.get_label() for line in ax.get_lines()] == ["RNN", "attention"]
        assert list(ax.get_lines()[0].get_xdata()) == [1, 2, 3]
        assert ax.get_xlabel() == "output position" and ax.get_ylabel() == "token accuracy"
        assert ax.get_ylim() == (-0.02, 1.02) and ax.get_legend() is not None
    finally:
        plt.close(ax.figure)


def test_accuracy_vs_length_plots_the_given_lengths():
    ax = accuracy_vs_length({"greedy": ([5, 10, 20], [1.0, 0.8, 0.4])}, title="t", ylabel="exact")
    try:
        line = ax.get_lines()[0]
        assert list(line.get_xdata()) == [5, 10, 20] and list(line.get_ydata()) == [1.0, 0.8, 0.4]
        assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("t", "input length (tokens)", "exact")
        assert ax.get_ylim() == (-0.02, 1.02) and ax.get_legend() is not None
    finally:
        plt.close(ax.figure)


def test_the_cost_plot_states_its_measured_slope_and_fits_its_guide_to_several_points():
    """A busy machine can make one run slow: the T² guide is fitted by least squares over the
    three longest lengths (not drawn through the last point), and the titles say the slope."""
    import matplotlib.pyplot as plt
    import numpy as np
    from course_lib.plotting import cost_curves

    lengths = [64, 128, 256, 512, 1024, 2048]
    seconds = [1e-6 * T ** 2 for T in lengths]
    seconds[-1] *= 3  # the longest run was slowed down
    axes = cost_curves(lengths, seconds, [4 * T * T for T in lengths])
    time_title, memory_title = axes[0].get_title(), axes[1].get_title()
    assert "slope 2.00" in memory_title and "slope" in time_title
    slope = float(time_title.split("slope ")[1].split()[0])
    assert 2.3 < slope < 3.0  # what the three longest show, outlier included
    guide = axes[0].get_lines()[1].get_ydata()
    measured = np.asarray(seconds) * 1e3
    # through the last point, the guide would lie 3x above the other two long lengths
    assert abs(np.log(guide[-1] / measured[-1])) < np.log(3) and abs(np.log(guide[-3] / measured[-3])) < np.log(3)
    plt.close("all")
