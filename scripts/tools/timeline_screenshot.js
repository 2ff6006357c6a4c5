// Renders a flexpar Chrome-trace timeline in Chromium's DevTools Performance panel and saves a
// screenshot: node timeline_screenshot.js TRACE.json OUT.png [zoom-at 0..1] [zoom steps] [clicks JSON]
// (used by scripts/timeline-screenshot; the clicks expand the process tracks drawn on the canvas).
const { chromium } = require('playwright-core');
(async () => {
  const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox', '--remote-debugging-port=9226'] });
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  await page.goto('http://127.0.0.1:9226/devtools/devtools_app.html?panel=timeline', { timeout: 15000 });
  await page.waitForTimeout(4000);
  await page.locator('input[type=file]').first().setInputFiles(process.argv[2]);
  await page.waitForTimeout(6000);
  const close = page.locator('[aria-label="Close"]');
  for (let i = 0; i < await close.count(); ++i) await close.nth(i).click({ timeout: 1000 }).catch(() => {});
  const sidebar = page.locator('[aria-label="Collapse sidebar"], [aria-label="Close sidebar"], [title="Collapse sidebar"]');
  if (await sidebar.count()) await sidebar.first().click({ timeout: 1000 }).catch(() => {});
  await page.waitForTimeout(500);
  await page.mouse.click(16, 39);  // hide the sidebar
  await page.waitForTimeout(800);
  const pts = JSON.parse(process.argv[6] || '[]');
  for (const [x, y] of pts) { await page.mouse.click(x, y); await page.waitForTimeout(500); }
  // Zoom: the last steps are steady state; hover the right part of the flame chart and press W.
  const frac = parseFloat(process.argv[4] || '0.8');
  await page.mouse.move(230 + frac * 1350, 300);
  for (let i = 0; i < parseInt(process.argv[5] || '0'); ++i) { await page.keyboard.press('w'); await page.waitForTimeout(60); }
  await page.waitForTimeout(1500);
  await page.screenshot({ path: process.argv[3] });
  await browser.close();
})().catch(e => { console.error(e.message.split('\n')[0]); process.exit(1); });
