package sim

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// palette colours the policies' lines, in summary order.
func palette() []string {
	return []string{"#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#ff7f0e", "#d62728", "#17becf", "#e377c2"}
}

// panel is one chart: data ranges and its place in the picture.
type panel struct {
	title                  string
	x0, x1, y0, y1         float64 // data ranges
	left, top, w, h        float64 // pixels
	xTicks, yTicks, yMinor float64
}

func (p panel) px(x, y float64) (float64, float64) {
	return p.left + (x-p.x0)/(p.x1-p.x0)*p.w, p.top + (1-(y-p.y0)/(p.y1-p.y0))*p.h
}

// WriteSVG plots the mean allocation curve of each policy against arrived
// demand: the whole run, and a zoom on the part where policies differ.
func WriteSVG(w io.Writer, sums []Summary, inflation float64) error {
	xMax := math.Round(100 * inflation)
	panels := []panel{
		{title: "GPU allocation vs arrived demand", x0: 0, x1: xMax, y0: 0, y1: 100, left: 70, top: 40, w: 420, h: 340, xTicks: 10, yTicks: 10},
		{title: "zoom", x0: 80, x1: xMax, y0: 84, y1: 98, left: 600, top: 40, w: 420, h: 340, xTicks: 10, yTicks: 2},
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="1060" height="520" font-family="sans-serif" font-size="12">`+"\n")
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	colors := palette()
	for _, p := range panels {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="14">%s</text>`+"\n", p.left, p.top-12, p.title)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="black"/>`+"\n", p.left, p.top, p.w, p.h)
		for x := p.x0; x <= p.x1+1e-9; x += p.xTicks {
			px, _ := p.px(x, p.y0)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", px, p.top, px, p.top+p.h)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%.0f</text>`+"\n", px, p.top+p.h+16, x)
		}
		for y := p.y0; y <= p.y1+1e-9; y += p.yTicks {
			_, py := p.px(p.x0, y)
			fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", p.left, py, p.left+p.w, py)
			fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%.0f</text>`+"\n", p.left-6, py+4, y)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">arrived GPU demand (%% of capacity)</text>`+"\n", p.left+p.w/2, p.top+p.h+36)
		fmt.Fprintf(&b, `<text transform="translate(%.0f,%.0f) rotate(-90)" text-anchor="middle">GPU allocated (%% of capacity)</text>`+"\n", p.left-44, p.top+p.h/2)
		fmt.Fprintf(&b, `<clipPath id="clip%.0f"><rect x="%.0f" y="%.0f" width="%.0f" height="%.0f"/></clipPath>`+"\n", p.left, p.left, p.top, p.w, p.h)
		for k, s := range sums {
			var pts []string
			for x, y := range s.MeanAlloc {
				if math.IsNaN(y) || float64(x) < p.x0 || float64(x) > p.x1 {
					continue
				}
				px, py := p.px(float64(x), y)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
			}
			fmt.Fprintf(&b, `<polyline clip-path="url(#clip%.0f)" fill="none" stroke="%s" stroke-width="1.6" points="%s"/>`+"\n",
				p.left, colors[k%len(colors)], strings.Join(pts, " "))
		}
	}
	// Legend, four entries a row, with the mean values at 100 and at the
	// last column.
	last := int(xMax)
	fmt.Fprintf(&b, `<text x="70" y="452">mean of %d seeds, allocation at 100 / %d:</text>`+"\n", seedsOf(sums), last)
	for k, s := range sums {
		x, y := 70+240*(k%4), 474+22*(k/4)
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="18" height="4" fill="%s"/>`, x, y-5, colors[k%len(colors)])
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s %.2f / %.2f</text>`+"\n", x+24, y, s.Policy, s.Alloc[100].Mean, at(s.MeanAlloc, last))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func seedsOf(sums []Summary) int {
	if len(sums) == 0 {
		return 0
	}
	return sums[0].Seeds
}

func at(xs []float64, i int) float64 {
	if i < 0 || i >= len(xs) {
		return math.NaN()
	}
	return xs[i]
}

// niceStep is a tick step of 1, 2 or 5 times a power of ten giving about n
// ticks over span.
func niceStep(span float64, n int) float64 {
	if span <= 0 || n <= 0 {
		return 1
	}
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// frame draws a panel's box, grid and tick labels; yTicks is the step.
func (p panel) frame(b *strings.Builder, xLabel, yLabel string) {
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-size="11">%s</text>`+"\n", p.left, p.top-8, p.title)
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="black"/>`+"\n", p.left, p.top, p.w, p.h)
	for x := math.Ceil(p.x0/p.xTicks) * p.xTicks; x <= p.x1+1e-9; x += p.xTicks {
		px, _ := p.px(x, p.y0)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", px, p.top, px, p.top+p.h)
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle" font-size="10">%g</text>`+"\n", px, p.top+p.h+12, x)
	}
	for y := math.Ceil(p.y0/p.yTicks) * p.yTicks; y <= p.y1+1e-9; y += p.yTicks {
		_, py := p.px(p.x0, y)
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", p.left, py, p.left+p.w, py)
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end" font-size="10">%g</text>`+"\n", p.left-4, py+3, math.Round(y*1000)/1000)
	}
	if xLabel != "" {
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle" font-size="11">%s</text>`+"\n", p.left+p.w/2, p.top+p.h+26, xLabel)
	}
	if yLabel != "" {
		fmt.Fprintf(b, `<text transform="translate(%.0f,%.0f) rotate(-90)" text-anchor="middle" font-size="11">%s</text>`+"\n", p.left-34, p.top+p.h/2, yLabel)
	}
	fmt.Fprintf(b, `<clipPath id="clip%.0f-%.0f"><rect x="%.0f" y="%.0f" width="%.0f" height="%.0f"/></clipPath>`+"\n", p.left, p.top, p.left, p.top, p.w, p.h)
}

// line draws ys (indexed by x) from x0 to x1 in the panel.
func (p panel) line(b *strings.Builder, ys []float64, color string, width float64, dash string) {
	var pts []string
	for x, y := range ys {
		if math.IsNaN(y) || float64(x) < p.x0 || float64(x) > p.x1 {
			continue
		}
		px, py := p.px(float64(x), y)
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
	}
	if dash != "" {
		dash = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
	}
	fmt.Fprintf(b, `<polyline clip-path="url(#clip%.0f-%.0f)" fill="none" stroke="%s" stroke-width="%.1f"%s points="%s"/>`+"\n",
		p.left, p.top, color, width, dash, strings.Join(pts, " "))
}

// WriteFamilySVG plots a family: on top, cand's mean allocation minus
// base's at every column, one line per workload; below, one small chart per
// workload with every policy's mean allocation over the upper part of the
// curve (from 60 % arrived), where policies part.
func WriteFamilySVG(w io.Writer, family string, wls []Workload, cand, base string) error {
	if len(wls) == 0 || len(wls[0].Curves) == 0 {
		return nil
	}
	lo, hi := wls[0].Curves[0].Lo, wls[0].Curves[0].Hi
	colors := palette()
	const cols, cw, ch = 4, 230.0, 150.0
	rows := (len(wls) + cols - 1) / cols
	width := 70 + cols*(cw+50)
	gapH := 240.0
	height := 60 + gapH + 90 + float64(rows)*(ch+60) + 20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")

	// Gap panel.
	gMin, gMax := -0.25, 0.25
	gaps := make([][]float64, len(wls))
	for k := range wls {
		a, c := wls[k].curve(cand), wls[k].curve(base)
		if a == nil || c == nil {
			continue
		}
		gaps[k] = make([]float64, len(a.At))
		for x := range gaps[k] {
			gaps[k][x] = math.NaN()
			if x >= lo && x <= hi && x < len(c.At) {
				gaps[k][x] = a.At[x].Mean - c.At[x].Mean
				gMin, gMax = math.Min(gMin, gaps[k][x]), math.Max(gMax, gaps[k][x])
			}
		}
	}
	step := niceStep(gMax-gMin, 6)
	gp := panel{title: fmt.Sprintf("family %s: %s minus %s, mean allocation at every x (points; above 0: %s ahead)", family, cand, base, cand),
		x0: float64(lo), x1: float64(hi), y0: math.Floor(gMin/step) * step, y1: math.Ceil(gMax/step) * step,
		left: 70, top: 40, w: width - 300, h: gapH, xTicks: 10, yTicks: step}
	gp.frame(&b, "arrived GPU demand (% of capacity)", "points")
	_, zy := gp.px(gp.x0, 0)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="black" stroke-width="1.2"/>`+"\n", gp.left, zy, gp.left+gp.w, zy)
	// Past the palette, lines repeat its colours dashed.
	dash := func(k int) string { return []string{"", "6,3", "2,2"}[k/len(colors)%3] }
	for k := range wls {
		if gaps[k] != nil {
			gp.line(&b, gaps[k], colors[k%len(colors)], 1.4, dash(k))
		}
	}
	for k, wl := range wls {
		y := 50 + 16*k
		lx := gp.left + gp.w + 14
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%d" x2="%.0f" y2="%d" stroke="%s" stroke-width="3" stroke-dasharray="%s"/><text x="%.0f" y="%d" font-size="10">%s</text>`+"\n",
			lx, y-3, lx+14, y-3, colors[k%len(colors)], dash(k), lx+18, y, wl.Name)
	}

	// Small multiples.
	top := 40 + gapH + 70
	fmt.Fprintf(&b, `<text x="70" y="%.0f" font-size="13">mean allocation (%% of capacity) against arrived demand, %d..%d; policies:</text>`+"\n", top-30, 60, hi)
	for k, c := range wls[0].Curves {
		x := 560 + 110*k
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="14" height="4" fill="%s"/><text x="%d" y="%.0f" font-size="11">%s</text>`+"\n", x, top-35, colors[k%len(colors)], x+18, top-30, c.Policy)
	}
	for k, wl := range wls {
		yMin, yMax := math.Inf(1), math.Inf(-1)
		for _, c := range wl.Curves {
			for x := 60; x <= hi && x < len(c.At); x++ {
				if v := c.At[x].Mean; !math.IsNaN(v) {
					yMin, yMax = math.Min(yMin, v), math.Max(yMax, v)
				}
			}
		}
		if math.IsInf(yMin, 0) {
			continue
		}
		st := niceStep(yMax-yMin, 4)
		p := panel{title: wl.Name, x0: 60, x1: float64(hi), y0: math.Floor(yMin/st) * st, y1: math.Ceil(yMax/st) * st,
			left: 70 + float64(k%cols)*(cw+50), top: top + float64(k/cols)*(ch+60), w: cw, h: ch, xTicks: 10, yTicks: st}
		if p.title == "" {
			p.title = "default"
		}
		p.frame(&b, "", "")
		for j, c := range wl.Curves {
			p.line(&b, c.Mean(), colors[j%len(colors)], 1.3, "")
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
