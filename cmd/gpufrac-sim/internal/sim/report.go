package sim

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Stat is a mean over seeds with its spread.
type Stat struct {
	Mean, SD, Min, Max float64
}

func stat(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{Mean: math.NaN(), SD: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := Stat{Min: math.Inf(1), Max: math.Inf(-1)}
	for _, x := range xs {
		s.Mean += x
		s.Min, s.Max = min(s.Min, x), max(s.Max, x)
	}
	s.Mean /= float64(len(xs))
	for _, x := range xs {
		s.SD += (x - s.Mean) * (x - s.Mean)
	}
	if len(xs) > 1 {
		s.SD = math.Sqrt(s.SD / float64(len(xs)-1))
	}
	return s
}

// Summary is one policy's results over seeds.
type Summary struct {
	Policy string
	Seeds  int
	// Alloc and Frag map a column (arrived % of capacity) to its statistic.
	Alloc, Frag map[int]Stat
	// MeanAlloc is the mean curve over seeds.
	MeanAlloc []float64
	// Failed is the mean number of pods that found no node.
	Failed float64
	// Elapsed is the mean and slowest wall time of one run.
	Elapsed, MaxElapsed time.Duration
}

// byPolicy groups results by policy: the policies in first-seen order and
// policy -> its results.
func byPolicy(results []*Result) ([]string, map[string][]*Result) {
	var order []string
	by := map[string][]*Result{}
	for _, r := range results {
		if _, ok := by[r.Policy]; !ok {
			order = append(order, r.Policy)
		}
		by[r.Policy] = append(by[r.Policy], r)
	}
	return order, by
}

// Summarize groups results by policy, in first-seen order, with statistics
// at the given columns.
func Summarize(results []*Result, cols []int) []Summary {
	order, by := byPolicy(results)
	out := make([]Summary, 0, len(order))
	for _, p := range order {
		rs := by[p]
		s := Summary{Policy: p, Seeds: len(rs), Alloc: map[int]Stat{}, Frag: map[int]Stat{}}
		for _, c := range cols {
			var a, f []float64
			for _, r := range rs {
				if c < len(r.Alloc) {
					a, f = append(a, r.Alloc[c]), append(f, r.Frag[c])
				}
			}
			s.Alloc[c], s.Frag[c] = stat(a), stat(f)
		}
		s.MeanAlloc = make([]float64, len(rs[0].Alloc))
		var total time.Duration
		for _, r := range rs {
			for x := range s.MeanAlloc {
				s.MeanAlloc[x] += r.Alloc[x] / float64(len(rs))
			}
			s.Failed += float64(r.Failed) / float64(len(rs))
			total += r.Elapsed
			s.MaxElapsed = max(s.MaxElapsed, r.Elapsed)
		}
		s.Elapsed = total / time.Duration(len(rs))
		out = append(out, s)
	}
	return out
}

// WriteMarkdown writes the summary table.
func WriteMarkdown(w io.Writer, sums []Summary, cols []int) error {
	var b strings.Builder
	b.WriteString("| policy | seeds |")
	for _, c := range cols {
		fmt.Fprintf(&b, " alloc@%d mean ± sd (min–max) |", c)
	}
	for _, c := range cols {
		fmt.Fprintf(&b, " frag@%d |", c)
	}
	b.WriteString(" failed pods | time/run (max) |\n|---|---|")
	for range 2 * len(cols) {
		b.WriteString("---|")
	}
	b.WriteString("---|---|\n")
	for _, s := range sums {
		fmt.Fprintf(&b, "| %s | %d |", s.Policy, s.Seeds)
		for _, c := range cols {
			a := s.Alloc[c]
			fmt.Fprintf(&b, " %.2f ± %.2f (%.2f–%.2f) |", a.Mean, a.SD, a.Min, a.Max)
		}
		for _, c := range cols {
			fmt.Fprintf(&b, " %.2f |", s.Frag[c].Mean)
		}
		fmt.Fprintf(&b, " %.0f | %.2fs (%.2fs) |\n", s.Failed, s.Elapsed.Seconds(), s.MaxElapsed.Seconds())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteCurves writes one policy's curves as CSV: a header "seed,0,1,...",
// then one row per seed of the chosen curve (alloc or frag).
func WriteCurves(w io.Writer, results []*Result, policy string, frag bool) error {
	var b strings.Builder
	header := false
	for _, r := range results {
		if r.Policy != policy {
			continue
		}
		curve := r.Alloc
		if frag {
			curve = r.Frag
		}
		if !header {
			b.WriteString("seed")
			for x := range curve {
				fmt.Fprintf(&b, ",%d", x)
			}
			b.WriteByte('\n')
			header = true
		}
		b.WriteString(strconv.FormatUint(r.Seed, 10))
		for _, v := range curve {
			fmt.Fprintf(&b, ",%.4f", v)
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}
