package sim

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Curve is one policy's allocation curve over seeds.
type Curve struct {
	Policy string
	Seeds  int
	// At is the allocation at every column x (arrived demand, % of
	// capacity) over seeds; columns with no data are NaN.
	At []Stat
	// Area is the curve's area over columns Lo..Hi divided by their span
	// (the mean allocation over that stretch of arrived demand, trapezoid
	// rule), over seeds.
	Area   Stat
	Lo, Hi int
}

// Curves returns each policy's curve, in first-seen order, with its area
// over columns lo..hi.
func Curves(results []*Result, lo, hi int) []Curve {
	order, by := byPolicy(results)
	out := make([]Curve, 0, len(order))
	for _, p := range order {
		rs := by[p]
		c := Curve{Policy: p, Seeds: len(rs), Lo: lo, Hi: hi, At: make([]Stat, len(rs[0].Alloc))}
		for x := range c.At {
			xs := make([]float64, 0, len(rs))
			for _, r := range rs {
				if x < len(r.Alloc) {
					xs = append(xs, r.Alloc[x])
				}
			}
			c.At[x] = stat(xs)
		}
		areas := make([]float64, len(rs))
		for k, r := range rs {
			areas[k] = Area(r.Alloc, lo, hi)
		}
		c.Area = stat(areas)
		out = append(out, c)
	}
	return out
}

// Area is the mean of curve over columns lo..hi by the trapezoid rule; NaN
// when the range is empty or a column in it is missing or NaN.
func Area(curve []float64, lo, hi int) float64 {
	if lo < 0 || hi >= len(curve) || hi <= lo {
		return math.NaN()
	}
	var sum float64
	for x := lo; x < hi; x++ {
		sum += (curve[x] + curve[x+1]) / 2
	}
	return sum / float64(hi-lo)
}

// Mean is the curve of means.
func (c *Curve) Mean() []float64 {
	m := make([]float64, len(c.At))
	for x, s := range c.At {
		m[x] = s.Mean
	}
	return m
}

// Gap compares the mean curves of a and b over a's Lo..Hi: the smallest
// a−b and the first column where it occurs, and a−b at the areas.
func Gap(a, b *Curve) (worst float64, at int, area float64) {
	worst, at = math.Inf(1), -1
	for x := a.Lo; x <= a.Hi && x < len(a.At) && x < len(b.At); x++ {
		if d := a.At[x].Mean - b.At[x].Mean; d < worst {
			worst, at = d, x
		}
	}
	return worst, at, a.Area.Mean - b.Area.Mean
}

// WriteCurveTable writes the curves at every column lo..hi as CSV:
// x, then mean, sd, min and max of each policy.
func WriteCurveTable(w io.Writer, curves []Curve) error {
	if len(curves) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("x")
	for _, c := range curves {
		fmt.Fprintf(&b, ",%[1]s_mean,%[1]s_sd,%[1]s_min,%[1]s_max", c.Policy)
	}
	b.WriteByte('\n')
	lo, hi := curves[0].Lo, curves[0].Hi
	for x := lo; x <= hi; x++ {
		fmt.Fprintf(&b, "%d", x)
		for _, c := range curves {
			s := Stat{Mean: math.NaN(), SD: math.NaN(), Min: math.NaN(), Max: math.NaN()}
			if x < len(c.At) {
				s = c.At[x]
			}
			fmt.Fprintf(&b, ",%.4f,%.4f,%.4f,%.4f", s.Mean, s.SD, s.Min, s.Max)
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteCurveMarkdown writes the whole-curve report of one workload: each
// policy's area, then the allocation every step columns from lo to hi.
func WriteCurveMarkdown(w io.Writer, curves []Curve, step int) error {
	if len(curves) == 0 {
		return nil
	}
	var b strings.Builder
	lo, hi := curves[0].Lo, curves[0].Hi
	fmt.Fprintf(&b, "| policy | seeds | area %d..%d mean ± sd (min–max) |\n|---|---|---|\n", lo, hi)
	for _, c := range curves {
		a := c.Area
		fmt.Fprintf(&b, "| %s | %d | %.3f ± %.3f (%.3f–%.3f) |\n", c.Policy, c.Seeds, a.Mean, a.SD, a.Min, a.Max)
	}
	b.WriteString("\n| x |")
	for _, c := range curves {
		fmt.Fprintf(&b, " %s mean ± sd |", c.Policy)
	}
	b.WriteString("\n|---|")
	for range curves {
		b.WriteString("---|")
	}
	b.WriteByte('\n')
	for x := lo; x <= hi; x += max(step, 1) {
		fmt.Fprintf(&b, "| %d |", x)
		for _, c := range curves {
			if x < len(c.At) {
				fmt.Fprintf(&b, " %.2f ± %.2f |", c.At[x].Mean, c.At[x].SD)
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Workload is one workload's curves in a family report.
type Workload struct {
	Name string
	// Mix describes the workload (openb.Mix.String).
	Mix    string
	Curves []Curve
}

func (wl *Workload) curve(policy string) *Curve {
	for k := range wl.Curves {
		if wl.Curves[k].Policy == policy {
			return &wl.Curves[k]
		}
	}
	return nil
}

// WriteFamilyMarkdown writes a family's table: per workload, each policy's
// curve area and, when both cand and base ran, cand's area and allocation
// minus base's: at the areas, at its worst column, at 100 and at the end.
func WriteFamilyMarkdown(w io.Writer, wls []Workload, cand, base string) error {
	if len(wls) == 0 || len(wls[0].Curves) == 0 {
		return nil
	}
	var b strings.Builder
	lo, hi := wls[0].Curves[0].Lo, wls[0].Curves[0].Hi
	b.WriteString("| workload |")
	for _, c := range wls[0].Curves {
		fmt.Fprintf(&b, " %s area ± sd |", c.Policy)
	}
	fmt.Fprintf(&b, " %[1]s − %[2]s: area | worst x (gap) | @100 | @%[3]d |\n|---|", cand, base, hi)
	for range wls[0].Curves {
		b.WriteString("---|")
	}
	b.WriteString("---|---|---|---|\n")
	for _, wl := range wls {
		fmt.Fprintf(&b, "| %s |", wl.Name)
		for _, c := range wl.Curves {
			fmt.Fprintf(&b, " %.3f ± %.3f |", c.Area.Mean, c.Area.SD)
		}
		a, bc := wl.curve(cand), wl.curve(base)
		if a == nil || bc == nil {
			b.WriteString(" | | | |\n")
			continue
		}
		worst, at, area := Gap(a, bc)
		mark := ""
		if worst < 0 {
			mark = " **below**"
		}
		fmt.Fprintf(&b, " %+.3f | %d (%+.3f%s) | %+.2f | %+.2f |\n", area, at, worst, mark,
			a.At[100].Mean-bc.At[100].Mean, a.At[hi].Mean-bc.At[hi].Mean)
	}
	fmt.Fprintf(&b, "\nArea: mean allocation over arrived demand %d..%d %% of capacity (trapezoid rule), per seed, then mean ± sd over seeds.\n", lo, hi)
	b.WriteString("Worst x: the arrived-demand column where the mean curves are closest (or furthest below), first one on ties.\n\nWorkloads as built:\n\n")
	for _, wl := range wls {
		fmt.Fprintf(&b, "- %s: %s\n", wl.Name, wl.Mix)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
