/* graph-harness: filters pytest-html's results table by mode, features and failed check, links
   the outcome grid to those filters, and fills each open row's details from its fragment.
   pytest-html replaces the whole table on every sort, filter and click, so the work is redone
   on each replacement (a MutationObserver), and only for rows that are shown and open. */
(function () {
  'use strict'
  const FIELDS = ['mode', 'features', 'check', 'text']

  // pytest-html builds each row from a template holding a <video> element, a thousand of
  // them again on every redraw: most of the cost of opening or clicking a large report.
  // This script runs before pytest-html's (the template is already parsed, the rows not yet
  // built); where no test attached an image or a video, no row ever shows one, and
  // pytest-html touches a row's media elements only for a row that has media.
  const script = document.currentScript
  const rowTemplate = document.getElementById('template_results-table__tbody')
  if (script && script.dataset.ghMedia === '0' && rowTemplate) {
    rowTemplate.content.querySelectorAll('video').forEach((video) => video.remove())
  }

  // Only failed rows start open (harness.report.html.COLLAPSED): pytest-html reads which
  // outcomes start collapsed from its data (render_collapsed) when its own script runs, at
  // the end of the page. The data element is parsed after this script and before that one,
  // and the parser runs the microtasks (this observer) before it runs a script.
  const collapsed = script ? script.dataset.ghCollapsed : ''
  if (collapsed) {
    const setCollapsed = (container) => {
      const blob = container.dataset.jsonblob || ''
      const wanted = JSON.stringify(collapsed.split(','))
      container.dataset.jsonblob = blob.replace(/"renderCollapsed":\s*\[[^\]]*\]/, '"renderCollapsed": ' + wanted)
    }
    const early = document.getElementById('data-container')
    if (early) setCollapsed(early)
    else {
      const watch = new MutationObserver(() => {
        const container = document.getElementById('data-container')
        if (container) {
          watch.disconnect()
          setCollapsed(container)
        }
      })
      watch.observe(document.documentElement, { childList: true, subtree: true })
    }
  }

  // pytest-html's "N tests took" leaves skipped tests out, so it disagreed with the rows and
  // the outcome counts beside it (82 against 87): say how many rows, and how many ran.
  const countRuns = () => {
    const line = document.querySelector('.run-count')
    const match = line && line.textContent.trim().match(/^(\d+) tests? took (.*?)\.?$/)
    if (!match) return
    let rows = 0
    let skipped = 0
    document.querySelectorAll('.filters input[data-test-result]').forEach((box) => {
      const n = parseInt((box.nextElementSibling || {}).textContent, 10) || 0
      rows += n
      if (box.dataset.testResult === 'skipped') skipped += n
    })
    if (rows && rows !== Number(match[1])) {
      line.textContent = `${rows} tests took ${match[2]} (${rows - skipped} ran, ${skipped} skipped).`
    }
  }

  const readHash = () => {
    const params = new URLSearchParams(window.location.hash.slice(1))
    const state = {}
    FIELDS.forEach((f) => { state[f] = params.get(f) || '' })
    return state
  }

  const writeHash = (state) => {
    const params = new URLSearchParams()
    FIELDS.forEach((f) => { if (state[f]) params.set(f, state[f]) })
    const hash = params.toString()
    history.replaceState(null, '', hash ? '#' + hash : window.location.pathname + window.location.search)
  }

  const cellText = (row, column) => {
    const cell = row.querySelector('td.col-' + column)
    return cell ? cell.textContent.trim() : ''
  }

  const matches = (row, state) => {
    if (state.mode && cellText(row, 'mode') !== state.mode) return false
    if (state.features && cellText(row, 'features') !== state.features) return false
    if (state.check) {
      const failed = cellText(row, 'check')
      if (state.check === '*' ? !failed : failed.split(' ')[0] !== state.check) return false
    }
    if (state.text && !(row.id || '').toLowerCase().includes(state.text.toLowerCase())) return false
    return true
  }

  // Every item's fragment, inflated once on first use (harness.report.html.render_fragments):
  // a promise of key -> HTML. body[data-gh-fragments] says when it is ready (or failed).
  let fragments = null
  const loadFragments = () => {
    if (fragments) return fragments
    fragments = (async () => {
      const source = document.getElementById('gh-fragments')
      if (!source) return {}
      const bytes = Uint8Array.from(atob(source.textContent), (c) => c.charCodeAt(0))
      const inflated = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('deflate'))
      return JSON.parse(await new Response(inflated).text())
    })().then((all) => {
      document.body.dataset.ghFragments = 'ready'
      return all
    }, (error) => {
      document.body.dataset.ghFragments = 'failed'
      console.error('graph-harness: cannot read the items\' details in this browser (' + error +
        '); the JSON results file holds the same records')
      return {}
    })
    return fragments
  }

  // A row's fragment key sits on its Mode cell; the fragment goes into pytest-html's own
  // slot for extra HTML in the row's details, once.
  const fillRow = (extras) => {
    const target = extras.querySelector('.extraHTML')
    const key = extras.dataset.ghKey
    if (!target || !key || extras.dataset.ghFilled) return
    extras.dataset.ghFilled = '1'
    // A row whose log was left out (a passed item) keeps pytest-html's empty log box: drop it.
    const logBox = extras.querySelector('.logwrapper')
    if (logBox && !logBox.querySelector('.log')) logBox.remove()
    loadFragments().then((all) => { if (all[key]) target.insertAdjacentHTML('beforeend', all[key]) })
  }

  // Open rows are filled as they come near the viewport: a redraw then lays out a screenful
  // of details, not those of every open row (pytest-html opens every failed and xfailed one).
  const nearView = 'IntersectionObserver' in window
    ? new IntersectionObserver((entries) => entries.forEach((entry) => {
      if (entry.isIntersecting) {
        nearView.unobserve(entry.target)
        fillRow(entry.target)
      }
    }), { rootMargin: '1500px 0px' })
    : null

  const fill = (row) => {
    const extras = row.querySelector('.extras-row')
    const cell = row.querySelector('td.col-mode[data-gh]')
    if (!extras || !cell || extras.classList.contains('hidden') || extras.dataset.ghFilled) return
    extras.dataset.ghKey = cell.dataset.gh
    if (nearView) nearView.observe(extras)
    else fillRow(extras)
  }

  const apply = () => {
    const state = readHash()
    if (nearView) nearView.disconnect()  // the rows it watched may have been replaced
    const rows = document.querySelectorAll('#results-table tbody.results-table-row')
    let shown = 0
    let total = 0
    rows.forEach((row) => {
      if (row.querySelector('#not-found-message')) return
      total += 1
      const show = matches(row, state)
      row.hidden = !show
      if (show) {
        shown += 1
        fill(row)
      }
    })
    const active = FIELDS.some((f) => state[f])
    const label = document.getElementById('gh-shown')
    if (label) label.textContent = active ? `showing ${shown} of ${total} rows` : `${total} rows`
    document.body.dataset.ghShown = String(shown)
    document.querySelectorAll('#gh-grid td.gh-cell').forEach((cell) => {
      cell.classList.toggle('gh-selected', !!state.mode && cell.dataset.mode === state.mode &&
        !!state.features && cell.dataset.features === state.features)
    })
    const form = document.getElementById('gh-filter')
    if (form) FIELDS.forEach((f) => { if (form.elements[f].value !== state[f]) form.elements[f].value = state[f] })
  }

  const setFilter = (changes) => {
    writeHash(Object.assign(readHash(), changes))
    apply()
  }

  const init = () => {
    const form = document.getElementById('gh-filter')
    if (form) {
      form.addEventListener('input', (evt) => setFilter({ [evt.target.name]: evt.target.value }))
      form.addEventListener('reset', () => setTimeout(() => setFilter({ mode: '', features: '', check: '', text: '' })))
    }
    document.querySelectorAll('#gh-grid td.gh-cell:not(.gh-empty)').forEach((cell) => {
      cell.addEventListener('click', () => {
        const state = readHash()
        const same = state.mode === cell.dataset.mode && state.features === cell.dataset.features
        setFilter(same ? { mode: '', features: '' } : { mode: cell.dataset.mode, features: cell.dataset.features })
        if (!same) document.getElementById('results-table')?.scrollIntoView({ behavior: 'smooth' })
      })
    })
    window.addEventListener('hashchange', apply)
    // pytest-html swaps in a new #results-table on every redraw: re-filter and re-fill then.
    new MutationObserver(apply).observe(document.body, { childList: true })
    loadFragments()
    countRuns()
    apply()
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init)
  else init()
})()
