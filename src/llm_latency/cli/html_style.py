"""The HTML report's style sheet: inline in the page (no font or file to fetch), printed in
colour, the waterfall's rows a grid of label, track and total."""

CSS = """
*{box-sizing:border-box}
html{-webkit-print-color-adjust:exact;print-color-adjust:exact}
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#212529;
background:#fff;max-width:1200px}
h1{font-size:22px;margin:0}h2{font-size:17px;margin:28px 0 8px}h3{font-size:14px;margin:16px 0 6px}
.sub{color:#6c757d;margin:2px 0 12px}
.url{overflow-wrap:anywhere;font-weight:400;font-family:ui-monospace,monospace;font-size:13px}
code{white-space:pre-wrap;font-size:12.5px}
.ep{display:inline-block;min-width:26px;padding:0 5px;border-radius:3px;background:#343a40;
color:#fff;font-size:12px;font-weight:600;text-align:center}
.conclusion{padding-left:20px;margin:6px 0}.conclusion li{margin:4px 0}
.err{color:#b00020}.none{color:#6c757d}
.findings{padding-left:20px;margin:4px 0}.finding{margin:6px 0 10px}
.finding p{margin:1px 0}.cause{font-weight:600}.evidence,.saving{color:#495057;font-size:13px}
table{border-collapse:collapse}
.kv{table-layout:fixed;width:100%}
.kv th{width:150px;text-align:left;font-weight:500;color:#495057;padding:2px 16px 2px 0;
vertical-align:top}.kv td{padding:2px 0;overflow-wrap:break-word}
.legend-eps{padding-left:20px;margin:4px 0 8px}
.cmp,.chart{width:100%;margin:4px 0}
.cmp th,.cmp td,.chart th,.chart td{padding:3px 8px;border-bottom:1px solid #e9ecef;text-align:left}
.cmp th,.chart th{font-weight:600;font-size:12px;color:#495057}
.cmp th,.cmp td{padding:3px 5px}.cmp-wrap{overflow-x:auto}
.v{text-align:right!important;white-space:nowrap;font-variant-numeric:tabular-nums}
.name{white-space:nowrap}
.chart .bars{width:100%;min-width:120px}.chart tfoot td{border:0}
.key{font-weight:400}.key i{display:inline-block;width:12px;height:10px;margin:0 3px 0 8px;
background:#868e96}.key i.k95{opacity:.4}
.chart .track{height:14px}.chart .p95{opacity:.4}
.legend{font-size:12px;color:#495057;margin:4px 0 8px}
.legend>span{display:inline-block;margin:0 14px 3px 0;white-space:nowrap}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.wf{margin:4px 0}
.wr{display:grid;grid-template-columns:190px minmax(0,1fr) 72px;column-gap:10px;
align-items:center;min-height:20px;padding:1px 0}
.wr .note,.wr .facts{grid-column:2/4;font-size:12px;color:#495057;line-height:1.3;
padding-bottom:2px}
.wr.o5xx .note,.wr.ofailed .note{color:#b00020}
.wr.o429{background:#fff4e6}.wr.o5xx,.wr.ofailed{background:#ffe3e3}.wr.o4xx{background:#fff9db}
.wr.o429 .note{color:#8a4b00}
.wl{display:flex;gap:4px;align-items:center;font-size:12px;white-space:nowrap}
.axis-row .wl,.axis-row .wv{color:#6c757d;font-size:11px}
.num{width:40px;text-align:right;font-variant-numeric:tabular-nums;color:#495057}
.st{width:46px;text-align:center;border-radius:3px;font-weight:600;font-size:11px;
background:#d8f3dc;color:#1b4332}
.st.s429{background:#ffa94d;color:#3d1f00}.st.s5xx,.st.sfailed{background:#c1121f;color:#fff}
.st.s4xx{background:#ffe066;color:#3d3000}
.cn{display:inline-block;width:62px;text-align:center;font-size:11px;border-radius:3px}
.cn.new{background:#1d3557;color:#fff}.cn.pooled{border:1px solid #adb5bd;color:#495057}
.legend .st,.legend .cn{display:inline-block;margin-right:4px}
.bk{color:#6c757d;font-style:italic;padding-left:44px}
.wv{text-align:right;font-size:12px;white-space:nowrap;font-variant-numeric:tabular-nums}
.track{position:relative;height:16px;background-color:#f8f9fa;
background-image:linear-gradient(to right,#dee2e6 1px,transparent 1px);
border-right:1px solid #dee2e6}
.env{position:absolute;top:2px;height:12px;background:#e9ecef}
.seg{position:absolute;top:0;height:100%}
.wf .seg{top:2px;height:12px}
.seg.failed{box-shadow:inset 0 0 0 2px #b00020}
.bseg{background:repeating-linear-gradient(45deg,#adb5bd 0 4px,#e9ecef 4px 8px)}
.axis{position:relative;height:22px}
.tm{position:absolute;top:0;width:1px;height:5px;background:#868e96}
.tick{position:absolute;top:6px;font-size:11px;color:#495057;white-space:nowrap;
font-variant-numeric:tabular-nums}
.tick.mid{transform:translateX(-50%)}.tick.last{transform:translateX(-100%)}
.caption{font-size:12px;color:#6c757d;margin:2px 0 0}
"""
