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
