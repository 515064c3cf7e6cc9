"""Certified fast maximum-weight assignment for MATCH's dense similarity matrices (see ``solve``)."""

from scanner.stats.assignment.solve import AssignmentResult, AssignmentStats, max_weight_assignment, solve_assignment

__all__ = ["AssignmentResult", "AssignmentStats", "max_weight_assignment", "solve_assignment"]
