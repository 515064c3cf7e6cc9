"""MATCH's matchings: the greedy matching (``greedy``) and the certified maximum-weight assignment.

The rest of this docstring is about the second (the paper's rule, MATCH's ``rule="exact"``); the greedy matching's
own docstring says what it does and why it is valid, and scanner.stats.matching how the default rule combines them.

``max_weight_assignment(similarity)`` returns what ``linear_sum_assignment(similarity, maximize=True)``
returns (row_ind = arange(rows), col_ind), but solves a sparse problem and proves, before returning,
that the answer is optimal for the dense problem.

How
---
0. Row maxima. Where every row's largest entry lies in a column no other row's does, taking them all is optimal:
   no assignment totals more than the sum of the rows' maxima (stats.method == "row-maxima"; one pass over the
   matrix). Related blocks end here, a permuted copy or a close fine-tune; the rest go on.
1. Candidates. Row i gets a threshold t_i and keeps every entry s_ij > t_i (about ``candidates`` of
   them: t_i is estimated from a sample of the row's columns, and taken exactly, as the
   (candidates+1)-th largest entry, where the estimate gives fewer than candidates/2 or more than
   4*candidates). Later rounds may add entries below t_i; every entry left out of row i is <= t_i,
   and that is all the certificate needs, whatever t_i is.
2. Feasibility. Hopcroft-Karp on the candidate graph. Without a matching covering every row, the rows
   of a Hall violator (reached from an unmatched row by alternating paths) get twice the candidates.
3. Sparse solve. ``lap.lapmod`` (sparse Jonker-Volgenant) for square problems, scipy's
   ``min_weight_full_bipartite_matching`` (LAPJVsp) for rectangular ones and as lapmod's fallback.
4. Certificate. With x(i) row i's column, the residual graph has one node per column and, for every
   candidate (i, j), an edge x(i) -> j of weight s_{i,x(i)} - s_ij (what the total loses when row i
   moves to j and frees x(i)). Shortest distances d from a virtual source joined to every column by
   weight-0 edges (a vectorised Bellman-Ford over the columns changed in the last round) give
   D_j = -d_j >= 0 and u_i = s_{i,x(i)} - D_{x(i)}. Checked in float64 with an absolute tolerance tol:
     (a) u_i + D_j >= s_ij - tol for every candidate (i, j);
     (b) D_j >= 0 for every column, D_j <= tol for every unmatched column (rectangular case);
     (c) u_i + D_j >= s_ij - tol for every EXCLUDED entry: first the O(1)-per-row sufficient test
         u_i + min_j D_j >= t_i - tol (excluded entries of row i are <= t_i), then, for rows it does
         not settle, entry by entry over the whole row.
   Soundness: (a)-(c) say (u, D) is feasible (to tol) for the dual of the dense LP relaxation
   max sum s_ij z_ij s.t. rows sum to 1, columns to <= 1, z >= 0 (dual: min sum u + sum D s.t.
   u_i + D_j >= s_ij, D >= 0), and the LP's optimum bounds every assignment. For any assignment
   sigma, sum_i s_{i,sigma(i)} <= sum u + sum_{j in sigma} D_j + n tol <= sum u + sum_all D + n tol,
   while our total is sum_i (u_i + D_{x(i)}) = sum u + sum_all D - sum_unmatched D. So our total is
   within gap_bound = n tol + sum_unmatched D (<= cols * tol) of the dense optimum: weak duality, no
   trust in any solver. The Bellman-Ford only proposes the potentials; they are checked directly,
   so a wrong sparse optimum or wrong potentials make the check fail, never pass. A row failing (c)
   has a real violation: its most violated entries (up to ``candidates``) become candidates, its
   threshold drops to twice its count, and the sparse problem is solved again; when at most
   ``repair_limit`` rows changed (square case), by freeing those rows and re-inserting each with one
   JV shortest augmenting path from the last optimum and its potentials, which costs a few Dijkstra
   scans instead of a new lapmod (the result is certified all the same). After ``max_rounds``
   sparse solves, or once the candidates would exceed ``dense_fraction`` of all entries, the answer
   is scipy's dense ``linear_sum_assignment`` (stats.method == "dense"). No uncertified sparse answer
   is ever returned.

Tolerance: tol = 2**-43 * scale (scale: the largest |s| among candidates, or of D), ~450 float64
ulps. The final distances satisfy every relaxation inequality as computed, so (a) carries rounding
errors of a few ulps, whatever the path lengths. For cosines (scale <= 1) and 11008 units,
gap_bound ~ 1e-9: far below float32's resolution of the similarities themselves.

Ties: where several assignments are optimal (or within gap_bound), any of them may be returned, and
it can differ from scipy's while having the same total weight (e.g. all-zero rows from dead units).
On continuous data the optimum is unique and the matching is scipy's, as the tests assert.

Shape: rows <= cols (every row is assigned; callers transpose otherwise, as MATCH does). NaN and +inf
entries raise ValueError; -inf entries are never chosen (scipy's maximize=True forbids them too).

Devices: a numpy array is handled on the CPU. A torch tensor (or ``device="cuda"``) has its
candidates selected on its device; only candidate entries (and the few rows step 4(c) needs) come to
the CPU, where the LAP and the certificate run. ``matching.cosine_similarity_matrix(a, b, device=...)`` builds the
similarity matrix on the GPU in the first place.

Modules, by role: ``sources`` (where the matrix lives: the ``SimilaritySource`` protocol, numpy and torch),
``candidates`` (the candidate graph in CSR: growing it, checking matchings against it), ``certificate``
(potentials and the checks (a)-(c)), ``solve`` (the rounds, the sparse solvers, the repair, the dense fallback);
``greedy`` (mutual-best rounds over each row's best candidates, on the matrix's own device).
"""

from scanner.stats.assignment.solve import AssignmentResult, AssignmentStats, max_weight_assignment, solve_assignment

__all__ = ["AssignmentResult", "AssignmentStats", "max_weight_assignment", "solve_assignment"]
